"""The agent loop: train any agent program through the gateway (``turnrl train`` + ``[agent]``).

One step, top to bottom (:meth:`AgentTrainer.train_step`):

1. draw ``rollout.tasks_per_step`` tasks; each gets ``rollout.group_size`` rollouts;
2. run the user's agent once per rollout, ``agent.concurrency`` at a time, against
   the in-process gateway with a base URL that names the rollout. Every chat
   completion the agent makes is sampled from the policy (the gateway batches
   concurrent calls) and recorded as a turn with its exact token ids, its
   ``role`` (the model name the agent asked for) and its ``policy_version``;
3. drop the rollouts whose agent failed (raised, timed out, no or a non-finite
   reward, non-zero exit, no call; details under ``agent_failures/``) and refuse
   any rollout sampled by two policy versions or at another temperature than
   ``policy.temperature``; more than ``agent.max_failure_fraction`` of them stops
   the run, naming the first;
4. credit the turn records with ``credit.estimator`` and run the PPO update of
   ``turnrl train`` (:mod:`turnrl.train.update.ppo`) inside ``gateway.updating``, so that
   nothing is sampled meanwhile; the gateway then serves the new weights.

Evaluation (after the warm start, every ``train.eval_every`` steps and at the end)
runs the same agent on the held-out tasks through a second gateway over the same
policy, at ``train.eval_temperature`` (0: greedy). The warm start is SFT on the
agent's own calls answered by ``warm_start.teacher``
(:mod:`turnrl.train.agent.teacher`), or ``warm_start.init_from``.

Where this departs from ``turnrl train``: rollouts are whatever the program does,
so the loop knows only what the gateway records and what the agent returns:
``success`` is ``info["success"]`` when the agent reports it (a bool or 0/1, else
the rollout fails; :mod:`turnrl.rollout.success`; no ``success``: reward > 0),
``tool_rate`` counts rollouts with a parsed tool call, ``turns`` counts calls (all
roles). Which calls share a batch depends on timing, so a resumed run is not
bit-identical to an uninterrupted one (each step still starts from the
checkpointed weights, optimiser and task sampler).

The order of a run (start or resume, steps, evaluations, checkpoints, close) is
:class:`~turnrl.train.lifecycle.Lifecycle`'s, whose
:class:`~turnrl.train.lifecycle.Trainer` this class implements: :meth:`setup` starts the
two gateways and their servers, :meth:`close` stops them. The run directory is the
shared one (:mod:`turnrl.train.run`); this loop adds::

    rollouts/step-000003.jsonl   every training rollout's turn records, with advantages
    rollouts/eval-000003.jsonl   the evaluation rollouts' records
    rollouts/teacher.jsonl       the warm start's demonstrations
    warm_start_check.json        the warm start's teacher-forced accuracy per kind, warnings
    agent_failures.jsonl         one line per failed rollout (where, ids, reason, file)
    agent_failures/step-000003/ROLLOUT.txt   traceback, or stderr and stdout, of each
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from turnrl.credit import compute_credit
from turnrl.errors import TurnrlError
from turnrl.io import append_jsonl, atomic_write_text, read_jsonl_tolerant
from turnrl.policy.factory import build_sampler, close_sampler
from turnrl.policy.sync import push_weights
from turnrl.records import dumps_record
from turnrl.rollout.context_cap import truncation_metrics
from turnrl.serve import Gateway, GatewayConfig, GatewayServer, bind_socket
from turnrl.table import TurnTable
from turnrl.train.agent.programs import make_program
from turnrl.train.agent.rollouts import plan_rollouts, refuse_untrainable, rollout_metrics
from turnrl.train.agent.runner import (
    AgentRunner,
    RolloutResult,
    counted_failures,
    failure_fraction_error,
)
from turnrl.train.agent.serving import (
    HOST,
    ServedAgents,
    agent_runner,
    gateway_config,
    serve_agents,
)
from turnrl.train.agent.tasks import load_tasks, rl_tasks, teacher_tasks
from turnrl.train.agent.teacher import TeacherGateway, load_teacher, teacher_examples
from turnrl.train.agent.teacher_mix import teacher_jobs, weighted_examples
from turnrl.train.agent.warm_quality import check_warm_start, write_check
from turnrl.train.config import RunConfig
from turnrl.train.eval_tasks import agent_eval_tasks
from turnrl.train.evaluate import evaluate_agents
from turnrl.train.lifecycle import LifecycleRun, Schedule, seed_process
from turnrl.train.metrics import advantage_metrics
from turnrl.train.policy_start import start_training
from turnrl.train.run import Checkpoint, RunDirectory, build_policy, derive_seed
from turnrl.train.update.legacy_pipeline import pipeline_of
from turnrl.train.update.ppo import UpdateBatch, build_update_batch, ppo_update, trainable_rows
from turnrl.train.validate import validate
from turnrl.types import Task, TurnRecord

__all__ = [
    "AgentRunError",
    "AgentTrainer",
    "plan_rollouts",
    "refuse_untrainable",
    "rollout_metrics",
]

logger = logging.getLogger("turnrl.agent")

FAILURES_DIR = "agent_failures"
FAILURES_LOG = "agent_failures.jsonl"


def keep_failures_of_done_steps(path: Path, done: int) -> None:
    """Cut ``agent_failures.jsonl`` back to the steps a resumed run keeps (atomically):
    the failures of ``step-N`` and ``eval-N`` with ``N <= done`` and the warm start's,
    none when ``done`` is 0 (the warm start and the step-0 evaluation are redone too).
    A run killed after logging a step's failures but before its checkpoint redoes that
    step, and would log them twice."""
    if not path.exists():
        return
    kept = []
    for row in read_jsonl_tolerant(path):
        number = str(row.get("at", "")).rpartition("-")[2]
        if done > 0 and (not number.isdigit() or int(number) <= done):  # warm_start: kept
            kept.append(row)
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in kept))


class AgentRunError(TurnrlError, ValueError):
    """Too many agent rollouts failed: the run stops (the message names the first failure).
    A ``ValueError``: the agent program is bad input, and ``turnrl train`` reports it in
    one line (exit code 2), not as a traceback."""


class AgentTrainer(LifecycleRun):
    """One agent-loop training job (a ``RunConfig`` with ``[agent]``).

    Everything checkable is checked before any work: the config (``validate``), the
    agent program (the entrypoint imported, the command found), the teacher, the task
    files and the gateway's port (bound here), then the run directory.
    """

    SPLITS_OVER_RANKS = False
    """Whether this trainer is rank 0 of several (:mod:`turnrl.train.agent.distributed`)."""

    def __init__(
        self,
        config: RunConfig,
        *,
        resume: bool = False,
        overwrite: bool = False,
        quiet: bool = False,
    ) -> None:
        validate(config)
        self.config = config
        agent, tasks = config.agent, config.tasks
        self.program = make_program(
            agent.entrypoint,
            agent.command or None,
            agent.env,
            isolation=agent.isolation,
        )
        teacher = config.warm_start.teacher
        self.teacher = load_teacher(teacher) if teacher is not None else None
        self.teacher_records: list[TurnRecord] = []  # the warm start's, for its check
        self.train_tasks = load_tasks(
            tasks.train, n=tasks.n_train, seed=tasks.seed, kwargs=tasks.kwargs
        )
        self.eval_tasks = agent_eval_tasks(tasks)
        warm = config.warm_start
        self.rl_tasks = rl_tasks(self.train_tasks, warm.teacher_tasks, warm.hold_out_teacher_tasks)
        """The tasks RL draws from: the training tasks, less the teacher's where held out."""
        if config.rollout.tasks_per_step > len(self.rl_tasks):
            raise ValueError(
                f"rollout.tasks_per_step: {config.rollout.tasks_per_step} distinct tasks per "
                f"step, but RL draws from {len(self.rl_tasks)} of {tasks.train}"
            )
        self.socket = bind_socket(HOST, agent.port)
        try:
            self.run_directory = RunDirectory.open(
                config,
                resume=resume,
                overwrite=overwrite,
                keep_checkpoints=config.train.keep_checkpoints,
                quiet=quiet,
                split_over_ranks=self.SPLITS_OVER_RANKS,
            )
        except Exception:
            self.socket.close()
            raise
        self.run_dir = self.run_directory.path
        seed_process(config.train.seed, config.train.threads)
        self.policy = build_policy(config.policy, config.train.seed)
        self.reference: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.sampler = np.random.default_rng(config.train.seed)
        self.step = 0
        self.calls = 0
        """Cumulative chat calls trained on (the agent loop's ``env_steps``)."""
        self._servers = contextlib.ExitStack()
        """The gateways and servers :meth:`setup` starts (closed by :meth:`close`)."""
        self._train_side: ServedAgents
        self._eval_side: ServedAgents

    # ------------------------------------------------------------------ one step
    def train_step(self, step: int) -> dict[str, Any]:
        """Step ``step``: draw tasks, run the agents, credit their turns, update; the
        step's metrics."""
        cfg = self.config
        started = time.perf_counter()
        self.step = step
        where = f"step-{self.step:06d}"
        # 1. tasks, 2. the agents, through the gateway
        results = self.step_rollouts(self.draw_jobs(), where)
        seconds_agents = time.perf_counter() - started
        # 3. what can be trained on
        refuse_untrainable(
            results,
            cfg.policy.temperature,
            learner_version=self.step - 1,
            max_staleness=cfg.train.max_staleness,
        )
        self.check_failures(results, where)
        records = [record for r in results if r.failure is None for record in r.records]
        row: dict[str, Any] = {
            "step": self.step,
            "episodes": sum(r.failure is None for r in results),
            **rollout_metrics(results),
            **self.truncation_metrics(results),
            "seconds_agents": seconds_agents,
            "episodes_per_second": len(results) / max(seconds_agents, 1e-9),
        }
        if not trainable_rows(records):
            # every rollout failed (agent.max_failure_fraction allowed it), or no row
            # trains (an agent whose only calls were n > 1 choices it never continued):
            # the step keeps its records and updates nothing; the weights stay
            if records:
                logger.warning("%s: no trainable row (every record train=false); no update", where)
            self.write_records(where, records)
            return {**row, "rows_trained": 0, "seconds_step": time.perf_counter() - started}
        # 4. credit, then the PPO update and the new weights to the gateway
        t0 = time.perf_counter()
        table = TurnTable.from_records(records, source=where)
        credit = compute_credit(table, cfg.credit.estimator, **cfg.credit.params)
        seconds_credit = time.perf_counter() - t0
        t0 = time.perf_counter()
        batch = build_update_batch(
            records,
            table,
            credit.advantages,
            credit.clip_factor,
            cfg.train.aggregation,
            legacy=pipeline_of(cfg.train, cfg.rollout.tasks_per_step, cfg.rollout.group_size),
            legacy_seed=derive_seed(cfg.train.seed, "update", self.step),
        )
        losses = self.update_and_serve(batch)
        seconds_update = time.perf_counter() - t0
        self.write_records(where, records, advantages=credit.advantages)
        self.calls += len(records)
        return {
            **row,
            "env_steps": self.calls,
            **advantage_metrics(
                table, credit.advantages, cfg.credit.estimator, learner_version=self.step - 1
            ),
            **losses,
            "policy_version": self.step,
            "seconds_credit": seconds_credit,
            "seconds_update": seconds_update,
            "seconds_step": time.perf_counter() - started,
        }

    def draw_jobs(self) -> list[tuple[str, Task]]:
        """This step's rollouts, drawn from the task sampler (:meth:`plan_jobs`)."""
        return self.plan_jobs(self.sampler, self.step)

    def plan_jobs(self, sampler: np.random.Generator, step: int) -> list[tuple[str, Task]]:
        """Step ``step``'s rollouts: ``rollout.tasks_per_step`` tasks drawn from
        ``sampler``, ``rollout.group_size`` rollouts each (ids ``s{step}-...``)."""
        cfg = self.config
        picks = sampler.choice(len(self.rl_tasks), cfg.rollout.tasks_per_step, replace=False)
        return plan_rollouts([self.rl_tasks[i] for i in picks], cfg.rollout.group_size, f"s{step}-")

    def step_rollouts(self, jobs: list[tuple[str, Task]], where: str) -> list[RolloutResult]:
        """The step's finished (or failed) rollouts: here its agents run now."""
        return self.run_agents(self._train_side.runner, jobs, where)

    def update_and_serve(self, batch: UpdateBatch) -> dict[str, float]:
        """The update, inside ``gateway.updating`` (nothing is sampled meanwhile); the
        gateway then serves the new weights as version ``step``."""
        with self._train_side.gateway.updating(version=self.step) as served:
            losses = self.update(batch)
            push_weights(self.policy, served, self.step)  # #26: a vLLM engine gets them here
        return losses

    def update(self, batch: UpdateBatch) -> dict[str, float]:
        """The PPO update of the step's batch (the gateway samples nothing meanwhile)."""
        assert self.optimizer is not None
        cfg = self.config
        return ppo_update(
            self.policy,
            self.optimizer,
            batch,
            cfg.train,
            temperature=cfg.policy.temperature,
            reference=self.reference,
            seed=derive_seed(cfg.train.seed, "update", self.step),
        )

    def evaluate(self) -> dict[str, float]:
        """The same agent on the held-out tasks (the eval gateway's temperature), as
        ``turnrl eval`` runs it (:func:`~turnrl.train.evaluate.evaluate_agents`)."""
        runner, gateway = self._eval_side.runner, self._eval_side.gateway
        gateway.swap_policy(self.served, version=self.step)  # same weights, version stamped
        where = f"eval-{self.step:06d}"
        evaluation = evaluate_agents(
            runner,
            self.eval_tasks,
            samples=self.config.train.eval_samples,
            prefix=f"e{self.step}-",
            failure_dir=self.run_dir / FAILURES_DIR / where,
            check=lambda results: self.check_failures(results, where),
        )
        self.write_records(where, evaluation.records)
        return evaluation.metrics

    # ------------------------------------------------------------------ helpers
    def run_agents(
        self, runner: AgentRunner, jobs: list[tuple[str, Task]], where: str
    ) -> list[RolloutResult]:
        """Run the jobs (failures' details saved under ``agent_failures/WHERE/``)."""
        return runner.run(jobs, failure_dir=self.run_dir / FAILURES_DIR / where)

    def truncation_metrics(self, results: list[RolloutResult]) -> dict[str, float]:
        """``context_truncated`` (and its share) of the step's rollouts when the run caps
        the context (``rollout.max_context_tokens``); nothing otherwise."""
        if self.config.rollout.max_context_tokens <= 0:
            return {}
        return truncation_metrics([r.truncated is not None for r in results])

    def check_failures(self, results: list[RolloutResult], where: str) -> None:
        """Log every failed rollout; stop the run when more than allowed failed (those
        the context cap ended are logged, not counted: the run asked for them). A served
        copy that can no longer sample (its process died under the agents:
        :attr:`~turnrl.train.process_copy.ProcessCopy.failure`) stops the run first,
        with its own one line: the agents' failures are the copy's, not theirs."""
        # (getattr twice: the teacher's warm start checks its failures before set-up
        # has made the served copy)
        served_failure = getattr(getattr(self, "served", None), "failure", None)
        if served_failure is not None:
            raise served_failure
        failed = [r.failure for r in results if r.failure is not None]
        for failure in failed:
            append_jsonl(self.run_dir / FAILURES_LOG, {"at": where, **asdict(failure)})
            logger.warning("agent failure in %s: %s", where, failure.describe())
        message = failure_fraction_error(
            counted_failures(results), len(results), self.config.agent.max_failure_fraction, where
        )
        if message is not None:
            raise AgentRunError(message)

    def write_records(
        self,
        name: str,
        records: Sequence[TurnRecord],
        advantages: Sequence[float] | None = None,
    ) -> None:
        """Write a step's records (with the advantage each was trained with, if any)."""
        self.run_directory.check_present()
        path = self.run_dir / "rollouts" / f"{name}.jsonl"
        path.parent.mkdir(exist_ok=True)
        if advantages is None:
            lines = [dumps_record(r) for r in records]
        else:
            lines = [
                dumps_record(r, advantage=float(a))
                for r, a in zip(records, advantages, strict=True)
            ]
        atomic_write_text(path, "".join(line + "\n" for line in lines))

    def gateway_config(self, temperature: float) -> GatewayConfig:
        return gateway_config(self.config, temperature)

    def runner(self, gateway: Gateway, server: GatewayServer) -> AgentRunner:
        return agent_runner(self.program, self.config, gateway, server)

    # ---------------------------------------------------------------- warm start
    def demonstrations(self) -> list[Any]:
        """The agent's calls on the training tasks answered by the teacher, as SFT rows."""
        assert self.teacher is not None
        cfg = self.config
        warm = cfg.warm_start
        chosen = teacher_tasks(self.train_tasks, warm.teacher_tasks)
        probability: dict[str, float] = {}
        if warm.mix == "per_draw":  # one rollout per variant, weighted (teacher_mix)
            mixed = teacher_jobs(
                chosen,
                cfg.tasks.train,
                tool_fraction=warm.tool_fraction,
                easy_tool_fraction=warm.easy_tool_fraction,
            )
            jobs = [(rid, task) for rid, task, _ in mixed]
            probability = {rid: p for rid, _, p in mixed}
        else:
            jobs = plan_rollouts(chosen, 1, "w-")
        tasks_by_rollout = {rid: dict(task.payload) for rid, task in jobs}
        config = self.gateway_config(cfg.policy.temperature)
        with (
            TeacherGateway(self.policy, self.teacher, tasks_by_rollout, config) as gateway,
            GatewayServer(gateway, sock=bind_socket(HOST, 0), list_rollouts=False) as server,
        ):
            results = self.run_agents(self.runner(gateway, server), jobs, "warm_start")
        self.check_failures(results, "warm_start")
        kept = [r for r in results if r.failure is None]
        records = [record for r in kept for record in r.records]
        self.write_records("teacher", records)
        self.run_directory.log(
            f"warm start: {len(records)} teacher turns from {len(kept)} rollouts "
            f"(mean reward {np.mean([r.reward for r in kept]):.3f})"
        )
        self.teacher_records = records
        examples = teacher_examples(records)
        return weighted_examples(examples, records, probability) if probability else examples

    @property
    def schedule(self) -> Schedule:
        cfg = self.config.train
        return Schedule(cfg.steps, cfg.eval_every, cfg.checkpoint_every, label="agent RL")

    def setup(self, checkpoint: Checkpoint | None) -> int:
        """A fresh warm start, or the state of ``checkpoint``; then the training and the
        evaluation gateways start serving the policy."""
        examples = self.demonstrations if self.teacher is not None else list
        start = start_training(
            self.run_directory, checkpoint, self.policy, self.config, examples, self.sampler
        )
        self.policy, self.reference, self.optimizer = start.policy, start.reference, start.optimizer
        if checkpoint is not None:
            self.step = checkpoint.step
            self.calls = int(checkpoint.extra["calls"])
        keep_failures_of_done_steps(self.run_dir / FAILURES_LOG, self.step)
        self.policy.model.eval()
        if len(self.rl_tasks) < len(self.train_tasks):
            self.run_directory.log(
                f"RL draws from {len(self.rl_tasks)} of {len(self.train_tasks)} training tasks "
                "(the warm start teacher's held out)"
            )
        self.served = self.served_policy()
        cfg = self.config
        self._train_side = self._serve(cfg.policy.temperature, self.socket)
        self._eval_side = self._serve(cfg.train.eval_temperature, bind_socket(HOST, 0))
        return self.step

    def served_policy(self) -> Any:
        """What the gateways sample from: the learner itself, a vLLM engine started from
        its weights (#26; a gateway batches ``agent.max_batch`` calls), or a vLLM server,
        which holds weights of its own: it is given the learner's here (the warm start's,
        or a resumed run's), before any agent calls it."""
        cfg = self.config
        served = build_sampler(cfg.policy, self.policy, rows=cfg.agent.max_batch)
        if cfg.policy.backend == "vllm-server":
            push_weights(self.policy, served, self.step)
        return served

    def _serve(self, temperature: float, sock: socket.socket) -> ServedAgents:
        """A gateway over the served policy at ``temperature``, its server on ``sock`` and
        the runner of agents against it; stopped by :meth:`close`."""
        return serve_agents(
            self._servers,
            self.served,
            self.program,
            self.config,
            temperature=temperature,
            sock=sock,
            version=self.step,
        )

    def start_metrics(self) -> dict[str, Any]:
        """The warm start's evaluation and its teacher-forced check (the step-0 row)."""
        evaluation = self.evaluate()
        return {**evaluation, **self.check_warm_start({"step": 0, **evaluation})}

    def check_warm_start(self, greedy: dict[str, float]) -> dict[str, float]:
        """Teacher-forced accuracy of the warm start per kind (its metrics), and a warning
        line per kind that fails (:mod:`turnrl.train.agent.warm_quality`)."""
        metrics, lines = check_warm_start(
            self.policy,
            self.teacher_records,
            self.train_tasks,
            greedy,
            max_new_tokens=self.config.policy.max_new_tokens,
        )
        for line in lines:
            self.run_directory.log(line)
        write_check(self.run_dir, metrics, lines)
        return metrics

    def checkpoint(self) -> None:
        """The weights, optimiser, task sampler and call count after the last step."""
        assert self.optimizer is not None
        self.run_directory.save_checkpoint(
            self.step,
            self.policy.state_dict(),
            self.optimizer.state_dict(),
            {"sampler": self.sampler.bit_generator.state, "calls": self.calls},
        )

    # ----------------------------------------------------------------------- run
    def describe(self, row: Mapping[str, Any]) -> str:
        """The progress bar's line for a step."""
        parts = [f"agent RL step {row['step']}", f"success {row.get('success', 0):.2f}"]
        parts.append(f"tools {row.get('tool_rate', 0):.2f}")
        if row.get("agent_failures"):
            parts.append(f"failures {row['agent_failures']:.0f}")
        return "  ".join(parts)

    def close(self) -> None:
        """Stop the gateways and their servers, close the port bound at construction and
        release the run directory's lock."""
        try:
            self._servers.close()
        finally:
            self.socket.close()
            try:
                close_sampler(self.policy, getattr(self, "served", None))  # vLLM's core (#26)
            finally:
                super().close()
