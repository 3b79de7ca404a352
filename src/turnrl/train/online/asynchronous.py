"""The environment trainer with ``train.max_staleness = K >= 1``: a sampler process
samples the next steps' rollouts while this process updates (docs/async.md).

Everything a step does is :class:`~turnrl.train.online.trainer.OnlineTrainer`'s: it
draws its tasks from the same task sampler, runs the ``independent`` strategy, and
learns; only the strategy's runner differs: instead of sampling, it takes the step's
episodes from the sampler process (:mod:`turnrl.train.async_sampler`), which sampled
them with the weights :func:`turnrl.train.staleness.sampling_version` names, with the
seeds and trajectory ids the synchronous trainer gives them. To request steps ahead,
a copy of the task sampler draws their tasks in step order; the step itself draws
them again from the real one and they must agree, so a checkpoint holds the task
sampler exactly as the synchronous trainer's does.

After every update the learner's weights (LoRA adapters merged; unmerged for a vLLM
server's sampler, which hands on adapters) go to the sampler (:meth:`_push_weights`),
followed by the requests of the steps that sample with them. With a vLLM server the
sampler process is the server's one client: this process evaluates with the learner
itself, so that no push of its own reaches the server between a step's requests.
Each step's row has the ``policy_version`` it sampled with, per-turn ``staleness_mean`` /
``staleness_max`` (versions behind the weights the update starts from),
``seconds_learner_idle`` (waiting for the step's episodes), ``seconds_sampler_idle``
(the sampler waiting before it started them) and ``seconds_push``.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from turnrl.policy import lora
from turnrl.policy.sync import full_weights
from turnrl.rollout import RolloutBatch
from turnrl.train.async_sampler import SamplerProcess, SamplerSpec
from turnrl.train.metrics import record_metrics
from turnrl.train.online.trainer import OnlineTrainer
from turnrl.train.run import Checkpoint, derive_seed, due
from turnrl.train.staleness import sampling_version, steps_sampled_with
from turnrl.types import Task

__all__ = ["AsyncOnlineTrainer", "online_trainer"]


def online_trainer(config: Any, **options: Any) -> OnlineTrainer:
    """The environment trainer ``config`` asks for: asynchronous when
    ``train.max_staleness >= 1``, else the synchronous one (bit for bit as before)."""
    if config.train.max_staleness >= 1:
        return AsyncOnlineTrainer(config, **options)
    return OnlineTrainer(config, **options)


class AsyncOnlineTrainer(OnlineTrainer):
    """:class:`OnlineTrainer` whose rollouts come from a sampler process (module
    docstring)."""

    def __init__(self, config: Any, **options: Any) -> None:
        super().__init__(config, **options)
        self.sampler_process: SamplerProcess | None = None
        self._lookahead: Any = None
        """A copy of the task sampler that draws the tasks of requested steps ahead."""
        self._requested: dict[int, tuple[str, ...]] = {}
        self._next_request = 1
        self._resumed_at = 0
        self._idle = {"seconds_push": 0.0}
        self._weights_dir: str | None = None
        """A vLLM server's staging directory for pushes (made in :meth:`_sampler_spec`)."""
        self._copy_has_base = False
        """Whether a vLLM server's copy (a LoRA learner's) already holds the frozen base:
        pushes after the first send the adapters alone (:meth:`_sampler_state`)."""
        self._engine_version: int | None = None
        """The version the learner's own sampler holds (a vLLM engine's is pushed
        lazily, :meth:`_push_weights`)."""

    # ------------------------------------------------------------------ schedule
    def _is_checkpoint(self, step: int) -> bool:
        """Whether ``step`` ends with a checkpoint (or is the one resumed from)."""
        return (
            step == self._resumed_at
            or self.schedule.checkpoints(step)
            or due(step, self.config.train.export_every)
        )

    def sampling_version(self, step: int) -> int:
        """The weight version step ``step`` samples with."""
        return sampling_version(step, self.config.train.max_staleness, self._is_checkpoint)

    # ------------------------------------------------------------------ set-up
    def setup(self, checkpoint: Checkpoint | None) -> int:
        """The sampler process starts first, so that building its copy (and starting its
        vLLM engine) overlaps the learner's own set-up and warm start; it samples
        nothing before the first push."""
        process = SamplerProcess(self._sampler_spec())
        try:
            done = super().setup(checkpoint)
        except BaseException:
            process.close()
            raise
        self.sampler_process = process
        self._resumed_at = done
        self._next_request = done + 1
        self._lookahead = copy.deepcopy(self.sampler)
        self._send_version()
        return done

    def _sampler_spec(self) -> SamplerSpec:
        """What the sampler process builds (:class:`SamplerSpec`), from the config."""
        cfg = self.config
        # a vLLM server's copy only stages the pushes (on the CPU, adapters unmerged) in
        # a directory this process makes and removes (a killed sampler leaves nothing)
        if self._on_server:
            self._weights_dir = tempfile.mkdtemp(prefix="turnrl-vllm-server-")
            policy = replace(cfg.policy, device="cpu")
        else:
            policy = replace(cfg.policy, lora_rank=0)
        return SamplerSpec(
            policy=policy,
            seed=cfg.train.seed,
            env_name=cfg.env.name,
            env_kwargs=dict(cfg.env.env_kwargs),
            max_new_tokens=cfg.policy.max_new_tokens,
            temperature=cfg.policy.temperature,
            group_size=cfg.rollout.group_size,
            prefix_cache=bool(cfg.rollout.params.get("prefix_cache", True)),
            per_episode_seeds=cfg.rollout.per_episode_seeds,
            max_context_tokens=cfg.rollout.max_context_tokens,
            rows=cfg.rollout.tasks_per_step * cfg.rollout.group_size,
            weights_dir=self._weights_dir or "",
        )

    @property
    def _on_server(self) -> bool:
        """Whether the sampler process samples on a vLLM server (``"vllm-server"``)."""
        return self.config.policy.backend == "vllm-server"

    def _build_rollout_policy(self) -> Any:
        """The learner's own sampler (it only evaluates here); the learner itself on a
        vLLM server: two clients pushing their own versions would change the server's
        weights under the sampler process's requests."""
        return self.policy if self._on_server else super()._build_rollout_policy()

    def _sampler_state(self) -> dict[str, Any]:
        """What a push sends: full weights, LoRA adapters merged (a transformers copy or
        an engine), or the model's own state dict, adapters unmerged (a vLLM server's
        copy, which hands the server adapters as the synchronous trainer does). To a
        LoRA learner's server copy, the whole state dict once, then only what the
        update changes (the trainable parameters: the adapters), since the base is
        frozen: a SmolLM2 push is then a few MB in shared memory, not the whole model."""
        whole = self._whole_policy()
        copy_has_adapters = self.config.policy.lora_rank > 0
        if self._on_server and lora.is_adapter_model(whole.model) == copy_has_adapters:
            state = whole.model.state_dict()
            if copy_has_adapters and self._copy_has_base:
                trained = {name for name, p in whole.model.named_parameters() if p.requires_grad}
                state = {name: t for name, t in state.items() if name in trained}
            self._copy_has_base = copy_has_adapters
            return {name: t.detach() for name, t in state.items()}
        return full_weights(whole)  # (also adapters loaded from a warm start, lora_rank 0)

    def _push_weights(self) -> None:
        """The weights to the sampler process; the learner's own vLLM engine (it only
        evaluates here) gets them when an evaluation needs them (:meth:`evaluate`), not
        after every update. A learner that samples with itself, or with its whole copy
        (FSDP2: the gather is a collective of every rank, which rank 0's evaluation
        alone cannot be), takes them at once."""
        if self.rollout_policy is self._whole_policy() or self._engine_version is None:
            super()._push_weights()
            self._engine_version = self.policy_version
        if self.sampler_process is not None:
            self._send_version()

    def evaluate(self) -> dict[str, float]:
        if self._engine_version != self.policy_version:
            super()._push_weights()
            self._engine_version = self.policy_version
        return super().evaluate()

    def _send_version(self) -> None:
        """Push the learner's weights to the sampler, then request the steps that sample
        with them (their tasks drawn ahead, in step order)."""
        assert self.sampler_process is not None
        cfg = self.config
        started = time.perf_counter()
        version = self.policy_version
        self.sampler_process.push(version, self._sampler_state())
        self._idle["seconds_push"] += time.perf_counter() - started
        steps = steps_sampled_with(
            version, cfg.train.max_staleness, self.schedule.steps, self._is_checkpoint
        )
        for step in steps:
            if step != self._next_request:
                raise RuntimeError(
                    f"async schedule: step {step} requested before step {self._next_request}"
                )
            picks = self._lookahead.choice(
                len(self.train_tasks), cfg.rollout.tasks_per_step, replace=False
            )
            tasks = [self.train_tasks[i] for i in picks]
            self._requested[step] = tuple(t.task_id for t in tasks)
            seed = derive_seed(cfg.train.seed, "rollout", step)
            self.sampler_process.request(step, tasks, seed, f"s{step}-", self._owned_slots())
            self._next_request = step + 1

    def _owned_slots(self) -> tuple[int, int] | None:
        """The task slots this process samples: all (None); a rank's share under torchrun."""
        return None

    # --------------------------------------------------------------- one step
    def _runner(self, tasks: list[Task]) -> Callable[..., RolloutBatch]:
        """The step's episodes from the sampler process, in place of sampling them
        (``tasks``: the step's whole draw, checked against what was requested)."""

        def take(policy: Any, make_env: Any, own_tasks: Sequence[Task], **kwargs: Any) -> Any:
            return self._take_sampled(tasks, **kwargs)

        return take

    def _take_sampled(self, tasks: Sequence[Task], **kwargs: Any) -> RolloutBatch:
        assert self.sampler_process is not None
        step = self.step
        expected = (derive_seed(self.config.train.seed, "rollout", step), f"s{step}-")
        drawn = tuple(t.task_id for t in tasks)
        if (
            self._requested.pop(step, None) != drawn
            or (
                kwargs.get("seed"),
                kwargs.get("traj_prefix"),
            )
            != expected
        ):
            raise RuntimeError(f"async schedule: step {step}'s request is not the step's draw")
        sampled, waited = self.sampler_process.receive(step)
        self._idle["seconds_learner_idle"] = waited
        self._idle["seconds_sampler_idle"] = sampled.idle_s
        return sampled.batch

    def train_step(self, step: int | None = None) -> dict[str, Any]:
        self._idle = {"seconds_push": 0.0}
        row = super().train_step(step)
        learned = [record for record, _ in self.learned.values()]
        row.update(record_metrics(learned, self.policy_version - 1))
        row.update(self._idle)
        return row

    def close(self) -> None:
        """Stop the sampler process, then close as the synchronous trainer does."""
        try:
            if self.sampler_process is not None:
                self.sampler_process.close()
            if self._weights_dir is not None:
                shutil.rmtree(self._weights_dir, ignore_errors=True)
        finally:
            super().close()
