"""The agent loop with ``train.max_staleness = 1``: partial rollouts (docs/async.md).

In the synchronous loop the gateway holds every agent's call while the learner
updates. Here the gateway serves a **copy** of the weights, so agents never wait for an
update: with ``policy.backend = "hf"`` a transformers copy (a LoRA learner's adapters
merged into it) that samples in a process of its own
(:class:`~turnrl.train.process_copy.ProcessCopy`), with ``"vllm"`` the run's vLLM
engine and with ``"vllm-server"`` the vLLM server, which also samples in a process of
its own (each holds weights of its own, as in the synchronous loop, and is given the
learner's only after an update):

* when step ``n``'s agents have finished, the agents of step ``n + 1`` start at once,
  in a background thread, against the gateway, while the learner credits and updates
  on step ``n``'s records (its own thread; with ``train.threads = 1`` the two use a
  core each);
* when the update is done, the learner's weights are copied into the served copy
  under the gateway's lock: the only moment calls wait, for as long as the copy takes;
  calls after it sample with version ``n``. A rollout of step ``n + 1`` can so hold
  turns of versions ``n - 1`` and ``n`` (a partial rollout); every turn records its
  ``policy_version`` and its sampler's log-probs, and the update corrects each turn by
  its own (``train.tis_cap``; :mod:`turnrl.train.update.turn_correction`), never by one
  ratio over a sequence whose turns came from two policies.

Admission control: step ``n + 1``'s agents start only once step ``n``'s have finished
(the update of step ``n + 1`` starts from version ``n``), so every turn trains at most
one version after the weights that sampled it (K = 1; the agent loop runs no further
ahead, a config error says so for K > 1). No finished rollout is discarded for
staleness and a task's group is trained whole, in the step it was drawn for. A step
whose row is evaluated, checkpointed or exported starts the next step's agents only
after its update: the evaluation runs alone on the updated weights, and nothing
sampled by older weights is in flight across a checkpoint, so ``--resume`` starts as
the uninterrupted run would have (one synchronous step after each). The tasks of a
step run ahead are drawn from a copy of the task sampler and checked against the
real draw when the step runs, so a checkpoint holds the synchronous loop's sampler.

Metrics per step besides the synchronous loop's: ``agents_ahead`` (1: the step's
agents ran during the previous update), ``seconds_learner_idle`` (the learner waiting
for the step's agents after its previous update), ``seconds_agents_idle`` (no agent of
the run running before this step's started, while the learner worked),
``seconds_push`` (copying the weights, the gateway held), and per turn
``staleness_mean`` / ``staleness_max`` (:func:`turnrl.train.metrics.record_metrics`).
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from turnrl.policy.sync import full_weights, push_weights
from turnrl.train.agent.loop import AgentTrainer
from turnrl.train.agent.runner import RolloutResult
from turnrl.train.async_sampler import shared_copy
from turnrl.train.process_copy import ProcessCopy
from turnrl.train.schedule import due
from turnrl.train.update.ppo import UpdateBatch
from turnrl.types import Task

__all__ = ["AgentsAhead", "AsyncAgentTrainer", "agent_trainer"]

JOIN_MARGIN_S = 30.0
"""How much longer than ``agent.timeout_s`` closing waits for agents run ahead."""


def agent_trainer(config: Any, **options: Any) -> AgentTrainer:
    """The agent loop ``config`` asks for: with partial rollouts when
    ``train.max_staleness >= 1``, else the synchronous loop (the same code as before)."""
    if config.train.max_staleness >= 1:
        return AsyncAgentTrainer(config, **options)
    return AgentTrainer(config, **options)


def job_ids(jobs: list[tuple[str, Task]]) -> list[tuple[str, str]]:
    """Each job's rollout id and task id."""
    return [(rollout_id, task.task_id) for rollout_id, task in jobs]


@dataclass
class AgentsAhead:
    """One step's agents running in a background thread during the previous update."""

    step: int
    jobs: list[tuple[str, Task]]
    started: float
    thread: threading.Thread | None = None
    results: list[RolloutResult] = field(default_factory=list)
    error: BaseException | None = None
    ended: float | None = None

    def wait(self, timeout: float | None = None) -> list[RolloutResult]:
        """The results once the agents have finished (their error re-raised here)."""
        assert self.thread is not None
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"step {self.step}'s agents did not finish in {timeout} s")
        if self.error is not None:
            raise self.error
        return self.results


class AsyncAgentTrainer(AgentTrainer):
    """:class:`AgentTrainer` whose next step's agents run during the update (module
    docstring)."""

    def __init__(self, config: Any, **options: Any) -> None:
        super().__init__(config, **options)
        self._ahead: AgentsAhead | None = None
        self._agents_ended: float | None = None
        """When the last batch of training agents finished (``perf_counter``)."""
        self._timing: dict[str, float] = {}

    # ------------------------------------------------------------------ set-up
    def served_policy(self) -> Any:
        """What the gateways sample from, apart from the learner: the vLLM engine or
        server of ``policy.backend = "vllm"`` / ``"vllm-server"`` (the synchronous
        loop's), else a frozen copy of the learner (LoRA merged) in a process of its
        own, given the learner's weights here. Only :meth:`update_and_serve` changes
        its weights after that."""
        if self.config.policy.backend in ("vllm", "vllm-server"):
            return super().served_policy()
        served = ProcessCopy(self.policy, self.config.policy, self.config.train.seed)
        try:
            served.load_full_weights(full_weights(self.policy), self.step)
        except BaseException:
            served.close()
            raise
        return served

    # ------------------------------------------------------------------ one step
    def train_step(self, step: int) -> dict[str, Any]:
        self._timing = {"seconds_push": 0.0}
        row = super().train_step(step)
        return {**row, **self._timing}

    def draw_jobs(self) -> list[tuple[str, Task]]:
        """The step's jobs; for a step run ahead, checked against what it ran."""
        jobs = super().draw_jobs()
        ahead = self._ahead
        ran = None if ahead is None or ahead.step != self.step else ahead.jobs
        if ran is not None and job_ids(ran) != job_ids(jobs):
            raise RuntimeError(
                f"agents ahead: step {self.step}'s agents ran other tasks than its draw"
            )
        return jobs

    def step_rollouts(self, jobs: list[tuple[str, Task]], where: str) -> list[RolloutResult]:
        """The agents run ahead for this step (waited for), or run now."""
        ahead, self._ahead = self._ahead, None
        waited_from = time.perf_counter()
        if ahead is not None and ahead.step == self.step:
            results = ahead.wait()
            started = ahead.started
        else:
            started = waited_from
            results = super().step_rollouts(jobs, where)
        now = time.perf_counter()
        idle_before = 0.0 if self._agents_ended is None else started - self._agents_ended
        self._timing.update(
            agents_ahead=float(ahead is not None),
            seconds_learner_idle=now - waited_from,
            seconds_agents_idle=max(idle_before, 0.0),
        )
        self._agents_ended = now if ahead is None else (ahead.ended or now)
        return results

    def update_and_serve(self, batch: UpdateBatch) -> dict[str, float]:
        """Start the next step's agents (where admitted), update, then copy the new
        weights into the served copy (the gateway held only for the copy)."""
        if self._admits_ahead(self.step):
            self._start_ahead(self.step + 1)
        losses = self.update(batch)
        started = time.perf_counter()
        to_server = hasattr(self.served, "load_learner")  # it takes the learner itself
        weights = None if to_server else full_weights(self.policy)  # merged before the hold
        if isinstance(self.served, ProcessCopy):  # and put in shared memory before it
            weights = shared_copy(weights)
        with self._train_side.gateway.updating(version=self.step) as served:
            load_full_weights = getattr(served, "load_full_weights", None)
            if weights is None:  # the vLLM server: adapters or full weights
                push_weights(self.policy, served, self.step)
            else:  # the vLLM engine or the copy's process (each stamps the version)
                load_full_weights(weights, self.step)
        self._timing["seconds_push"] += time.perf_counter() - started
        return losses

    # ---------------------------------------------------------------- admission
    def _admits_ahead(self, step: int) -> bool:
        """Whether step ``step + 1``'s agents may run during step ``step``'s update: not
        past the last step, and not when ``step`` is evaluated, checkpointed or exported
        (module docstring)."""
        schedule = self.schedule
        return (
            step < schedule.steps
            and not schedule.evaluates(step)
            and not schedule.checkpoints(step)
            and not due(step, self.config.train.export_every)
        )

    def _start_ahead(self, step: int) -> None:
        """Run step ``step``'s agents in a background thread, their tasks drawn from a
        copy of the task sampler (the real draw happens, and is checked, at ``step``)."""
        jobs = self.plan_jobs(copy.deepcopy(self.sampler), step)
        where = f"step-{step:06d}"
        ahead = AgentsAhead(step, jobs, started=time.perf_counter())
        runner = self._train_side.runner

        def run() -> None:
            try:
                ahead.results = self.run_agents(runner, jobs, where)
            except BaseException as error:  # re-raised by wait() in the learner's thread
                ahead.error = error
            finally:
                ahead.ended = time.perf_counter()

        ahead.thread = threading.Thread(target=run, name=f"turnrl-agents-{step}", daemon=True)
        self._ahead = ahead
        ahead.thread.start()

    # --------------------------------------------------------------------- close
    def close(self) -> None:
        """Stop the gateways first (agents run ahead then fail at their next call), wait
        for those agents, then close as the synchronous loop does."""
        try:
            self._servers.close()
            ahead, self._ahead = self._ahead, None
            if ahead is not None and ahead.thread is not None:
                ahead.thread.join(self.config.agent.timeout_s + JOIN_MARGIN_S)
        finally:
            super().close()
