"""The run configuration of ``turnrl train``: ``RunConfig`` and its own sections.

A run is one of two modes (``RunConfig.mode``): a built-in (or ``module:factory``)
environment, whose tasks come from ``[env]``, or a user agent program (``[agent]``
with an ``entrypoint`` or a ``command``, see docs/agents.md), whose tasks come from
``[tasks]`` (:mod:`turnrl.train.agent.config`). A section of the other mode is
refused, in the file or an override (naming the file, line and field) and in code,
and the saved ``config.toml`` holds only the run's own sections.

Here: ``[rollout]``, ``[credit]``, ``[train]`` and ``RunConfig``; the sections
``turnrl iterate`` shares (``[env]``, ``[policy]``, ``[warm_start]``, the PPO update)
are in :mod:`turnrl.train.sections`. Every field carries an attribute docstring
(shown by ``describe_config`` and written into the saved config); every section
checks its own values in a ``check(p)`` method beside its fields, and
``RunConfig.check`` what the sections need of each other (:mod:`turnrl.train.validate`
walks them and reports every problem at once). Reading TOML, overrides and error
locations is generic: :mod:`turnrl.config_toml`. This module re-exports the names
callers use (every section class, ``load_config``...), so ``turnrl.train.config``
stays the one import for a run's config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from turnrl.config_toml import (
    config_origin,
    config_to_dict,
    config_to_toml_text,
    describe_config,
    field_docs,
    load_config,
)
from turnrl.entrypoints import ENTRYPOINT_FORMAT
from turnrl.train import bounds
from turnrl.train.agent.config import AgentConfig, TasksConfig
from turnrl.train.sections import (
    Aggregation,
    EnvConfig,
    KLEstimator,
    LoggingConfig,
    PolicyConfig,
    PPOConfig,
    Precision,
    UpdateLayout,
    WarmStartConfig,
    check_update_precision,
)
from turnrl.train.staleness import check_staleness
from turnrl.train.validate import Problems

__all__ = [
    "AgentConfig",
    "Aggregation",
    "CreditConfig",
    "EnvConfig",
    "KLEstimator",
    "LoggingConfig",
    "PPOConfig",
    "PolicyConfig",
    "Precision",
    "RolloutConfig",
    "RunConfig",
    "TasksConfig",
    "TrainConfig",
    "UpdateLayout",
    "WarmStartConfig",
    "config_origin",
    "config_to_dict",
    "config_to_toml_text",
    "describe_config",
    "field_docs",
    "load_config",
]

# --------------------------------------------------------------------------- config sections


@dataclass
class RolloutConfig:
    """How rollouts are collected each step."""

    strategy: str = "independent"
    """Rollout strategy: ``independent`` samples or a tree strategy (see ``turnrl.rollout``)."""
    group_size: int = 8
    """Rollouts (or branches) per task."""
    tasks_per_step: int = 8
    """Distinct tasks per training step."""
    params: dict[str, Any] = field(default_factory=dict)
    """Strategy-specific parameters, passed through unchanged."""
    workers: int = 0
    """Ray actors that run the ``independent`` strategy's episodes (needs the ``ray``
    extra; see docs/ray-workers.md); they get the weights after every update. 0 samples
    in this process. With workers, every episode samples with its own seed."""
    ray_address: str | None = None
    """Ray cluster to join when ``workers > 0`` (e.g. ``"auto"`` or ``"ray://head:10001"``);
    unset starts a local Ray instance."""
    per_episode_seeds: bool = False
    """Every episode of a step samples from its own seed (derived from the step's seed and
    its index in the step), so the step's episodes are the same however the batch is
    split: across Ray workers (always on there) or torchrun ranks, which need it
    (docs/distributed.md). Off: one seed for the batch, as before. ``independent``
    strategy only."""
    max_context_tokens: int = 0
    """Per-turn context cap: a turn is sampled only if its prompt plus
    ``policy.max_new_tokens`` fit in this many tokens; the next turn of an episode that
    does not fit is not sampled and the episode ends truncated (counted as
    ``context_truncated``). An agent program's call over it gets a 400
    ``context_length_exceeded`` and its rollout ends truncated (docs/memory.md). 0: the
    model's context, as without the cap."""

    def check(self, p: Problems) -> None:
        """The strategy is registered and its ``params`` fit it; workers and per-episode
        seeds need ``independent``."""
        from turnrl.rollout import get_strategy
        from turnrl.rollout.strategies import list_strategies

        p.at_least("group_size", self.group_size, 1)
        p.at_least("tasks_per_step", self.tasks_per_step, 1)
        p.at_most("group_size", self.group_size, bounds.MAX_GROUP_SIZE, bounds.WHY)
        p.at_most("tasks_per_step", self.tasks_per_step, bounds.MAX_TASKS_PER_STEP, bounds.WHY)
        rollouts = self.group_size * self.tasks_per_step
        within = (
            self.group_size <= bounds.MAX_GROUP_SIZE
            and self.tasks_per_step <= bounds.MAX_TASKS_PER_STEP
        )
        if within and rollouts > bounds.MAX_ROLLOUTS_PER_STEP:
            p.add(
                "group_size",
                f"{self.group_size} x rollout.tasks_per_step = {self.tasks_per_step} is "
                f"{rollouts} rollouts per step; must be <= {bounds.MAX_ROLLOUTS_PER_STEP} "
                f"({bounds.WHY})",
            )
        p.at_least("workers", self.workers, 0)
        p.at_least("max_context_tokens", self.max_context_tokens, 0)
        if p.one_of("strategy", self.strategy, list_strategies()):
            p.options("params", get_strategy(self.strategy), self.params, skip=3)
            if self.workers > 0 and self.strategy != "independent":
                p.add("workers", "rollout workers run only the 'independent' strategy")
            if self.per_episode_seeds and self.strategy != "independent":
                p.add("per_episode_seeds", "only the 'independent' strategy samples per episode")


@dataclass
class CreditConfig:
    """Credit assignment: which registered advantage estimator, with which parameters."""

    estimator: str = "grpo"
    """Registered estimator name (see ``turnrl.credit``)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Estimator parameters (e.g. ``group_key``, ``gamma``), passed through unchanged."""

    def check(self, p: Problems) -> None:
        """The estimator is registered and its ``params`` fit it."""
        from turnrl.credit import get_estimator, list_estimators

        if p.one_of("estimator", self.estimator, list_estimators(with_aliases=True)):
            p.options("params", get_estimator(self.estimator).fn, self.params, skip=1)


FSDP2_NO_CHUNKS = (
    "must be 0 with train.sharding = 'fsdp2': chunked log-probs call the decoder body and "
    "the output layer directly, which skips the sharded model's gathering of its weights"
)
"""Why ``train.logprob_chunk_tokens`` is refused with FSDP2 sharding."""


@dataclass
class TrainConfig(PPOConfig):
    """The RL optimisation loop (and its PPO update)."""

    steps: int = 100
    """Number of training steps (one rollout batch each)."""
    seed: int = 0
    """Seed of sampling and initialisation."""
    eval_every: int = 20
    """Evaluate on the held-out tasks every this many steps (and at the start and end; 0: only
    then)."""
    eval_temperature: float = 0.0
    """Sampling temperature of evaluation; 0 is greedy decoding."""
    eval_samples: int = 1
    """Episodes per held-out task at evaluation (more than 1 only makes sense when sampling)."""
    log_rollouts_every: int = 10
    """Write the step's turn records (with advantages) to ``rollouts/`` every this many
    steps; 0 disables."""
    checkpoint_every: int = 50
    """Save a checkpoint every this many steps (and at the end; 0: only at the end)."""
    keep_checkpoints: int = 2
    """How many of the most recent checkpoints to keep on disk."""
    export_every: int = 0
    """Export the policy as a Hugging Face model directory to ``policy/step-N/`` every this
    many steps (a checkpoint is saved at each; docs/export.md); 0: never. The final policy
    is always exported to ``policy/``."""
    threads: int = 0
    """Torch intra-op threads; 0 keeps torch's default. 1 lets several runs share a machine."""
    legacy_mini_batch: int = 0
    """``aggregation = "legacy-verl"``: the pipeline's ``ppo_mini_batch_size`` (rows: the drop
    rounds to a multiple of it; its actor mini-batch is this times ``rollout.group_size``);
    0: ``rollout.tasks_per_step`` (calc_x's proportions)."""
    legacy_micro_batch: int = 4
    """``aggregation = "legacy-verl"``: ``ppo_micro_batch_size_per_gpu`` (rows per token mean)."""
    legacy_max_prompt_length: int = 0
    """``aggregation = "legacy-verl"``: rows whose prompt has more tokens are dropped (after
    the advantages); 0 drops none."""
    sharding: Literal["none", "fsdp2"] = "none"
    """How torchrun ranks hold the learner (docs/distributed.md): ``none``: each rank holds
    all of it, gradients summed over ranks; ``fsdp2``: ``torch.distributed.fsdp.
    fully_shard`` splits its weights, gradients and AdamW state over the ranks, and a
    whole copy gathered once per step samples (built-in environments only; needs 2 or
    more ranks)."""
    max_staleness: int = 0
    """``K >= 1``: a sampler process with its own copy of the weights samples the next
    steps' rollouts while the learner updates; step ``n`` samples with the weights of
    ``max(n - 1 - K, last checkpoint before n)`` updates, and each turn is corrected by
    its own behaviour log-probs when ``tis_cap > 0`` (docs/async.md). Built-in
    environments, ``independent`` strategy, ``policy.backend = "hf"``, one process. 0:
    sample, then update, as always (the same numbers bit for bit)."""

    def check(self, p: Problems) -> None:
        p.at_least("steps", self.steps, 0)
        p.at_least("eval_every", self.eval_every, 0)
        p.at_least("eval_temperature", self.eval_temperature, 0)
        p.at_least("eval_samples", self.eval_samples, 1)
        p.at_most("eval_samples", self.eval_samples, bounds.MAX_EVAL_SAMPLES, bounds.WHY)
        p.at_least("log_rollouts_every", self.log_rollouts_every, 0)
        p.at_least("checkpoint_every", self.checkpoint_every, 0)
        p.at_least("keep_checkpoints", self.keep_checkpoints, 1)
        p.at_least("export_every", self.export_every, 0)
        p.at_least("threads", self.threads, 0)
        if self.sharding == "fsdp2" and self.logprob_chunk_tokens > 0:
            p.add("logprob_chunk_tokens", FSDP2_NO_CHUNKS)
        p.at_least("legacy_mini_batch", self.legacy_mini_batch, 0)
        p.at_least("legacy_micro_batch", self.legacy_micro_batch, 1)
        p.at_least("legacy_max_prompt_length", self.legacy_max_prompt_length, 0)
        super().check(p)


@dataclass
class RunConfig:
    """A complete training run."""

    MAY_CHANGE_ON_RESUME: ClassVar[tuple[str, ...]] = (
        "run_dir",
        "label",
        "train.steps",
        "train.eval_every",
        "train.log_rollouts_every",
        "train.checkpoint_every",
        "train.keep_checkpoints",
        "train.export_every",
        "train.threads",
        "train.sharding",
        "train.gradient_checkpointing",
        "train.logprob_chunk_tokens",
        "rollout.ray_address",
        "agent.concurrency",
        "agent.port",
        "agent.timeout_s",
        "agent.max_failure_fraction",
        "logging.trackers",
        "logging.project",
        "logging.offline",
        "logging.report",
    )
    """Fields a resumed run may change (``--resume``); any other difference from the
    run's ``config.toml`` is refused (:class:`turnrl.train.run.RunDirectory`)."""
    STEPS_KEY: ClassVar[str] = "train.steps"
    """The run's step count: ``--resume`` may not lower it below the steps done."""

    run_dir: str = "runs/default"
    """Directory for metrics, checkpoints, records and the config copy."""
    label: str | None = None
    """Name of this run in reports (runs sharing a label are seeds of one method);
    defaults to the run directory's name."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The built-in (or ``module:factory``) environment to train on; environment runs
    only (refused beside an ``[agent]`` program)."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """Policy section."""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    """Warm-start (SFT) section."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout section."""
    credit: CreditConfig = field(default_factory=CreditConfig)
    """Credit-assignment section."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """RL training section."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """A user agent program to train instead of a built-in environment (agent loop);
    setting its ``entrypoint`` or ``command`` makes the run an agent run."""
    tasks: TasksConfig = field(default_factory=TasksConfig)
    """Tasks of the agent loop; agent runs only."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Experiment trackers that receive every metrics row (docs/trackers.md)."""

    @property
    def mode(self) -> Literal["env", "agent"]:
        """``"agent"`` when ``[agent]`` names a program (``entrypoint`` or ``command``),
        else ``"env"``: the two kinds of run, each with its own sections."""
        return "agent" if self.agent.enabled else "env"

    def inactive_sections(self) -> dict[str, str]:
        """The sections this run's mode does not read, each with why: ``load_config``
        refuses them in a file or an override, ``config_to_toml_text`` leaves them out,
        ``check`` refuses values set in code (:mod:`turnrl.config_toml`)."""
        if self.mode == "agent":
            return {
                "env": "[env] is for built-in environment runs; an [agent] program's "
                "tasks come from [tasks] (remove the [env] section)"
            }
        why = (
            "is for agent programs, and agent.entrypoint and agent.command are unset "
            "(set one of them, or remove the [{name}] section: this run trains on [env])"
        )
        return {name: f"[{name}] {why.format(name=name)}" for name in ("agent", "tasks")}

    def check(self, p: Problems) -> None:
        """What the sections need of each other, in either mode."""
        if self.policy.backend != "hf" and self.rollout.workers:
            p.add(
                "policy.backend",
                f"{self.policy.backend!r} samples in this process (the built-in "
                "environments' rollouts and the agent loop's gateway); rollout.workers "
                "sample with 'hf' only",
            )
        if not self.run_dir:
            p.add("run_dir", "must name a directory")
        check_staleness(self, p)
        self._check_engine_beside_ranks(p)
        self._check_context_cap(p)
        check_update_precision(self.policy, self.train, "train", p)
        self._check_inactive(p)
        if self.mode == "agent":
            self._check_agent_run(p)
        else:
            self._check_env_run(p)

    def _check_engine_beside_ranks(self, p: Problems) -> None:
        """No in-process vLLM engine in a torchrun rank: vLLM makes its process groups
        with ``torch.distributed.new_group``, a collective of every rank of the world
        torchrun started, at the moment each rank builds its engine, while the others
        are in another collective (the start state's broadcast): the ranks wait for
        each other forever (found 2026-12-07, K = 0 and K = 1 alike, 2 ranks on the
        tiny model, every stack in the start-up)."""
        if self.policy.backend != "vllm":
            return
        from turnrl.train.distributed import world_from_env

        world = world_from_env()
        if world.split:
            p.add(
                "policy.backend",
                f"'vllm' cannot run in torchrun's {world.size} ranks: each rank's "
                "in-process engine makes vLLM's process groups with a collective of every "
                "rank, and the ranks deadlock; use 'hf' or 'vllm-server' under torchrun, "
                "or 'vllm' in one process",
            )

    def _check_context_cap(self, p: Problems) -> None:
        """``rollout.max_context_tokens`` leaves room for a prompt beside a response of
        ``policy.max_new_tokens`` and is at most the model's context (when known without
        loading it; otherwise the smaller of the two bounds at run time)."""
        from turnrl.policy.factory import model_context

        cap, new = self.rollout.max_context_tokens, self.policy.max_new_tokens
        if cap <= 0:
            return
        context = model_context(self.policy.model)
        if cap <= new:
            p.add(
                "rollout.max_context_tokens",
                f"{cap} leaves no room for a prompt beside a response of policy.max_new_tokens"
                f" = {new}; give more than {new} (0: no cap)",
            )
        elif context is not None and cap > context:
            p.add(
                "rollout.max_context_tokens",
                f"{cap} is more than the {context}-position context of policy.model = "
                f"{self.policy.model!r}; give at most {context} (0: the model's context)",
            )

    def _check_inactive(self, p: Problems) -> None:
        """A section of the other mode still at its defaults (a config built in code;
        ``load_config`` refuses one a file or an override sets)."""
        for name, why in self.inactive_sections().items():
            section, default = getattr(self, name), type(getattr(self, name))()
            changed = [
                f.name
                for f in dataclasses.fields(section)
                if f.name not in ("entrypoint", "command")
                and getattr(section, f.name) != getattr(default, f.name)
            ]
            if changed:
                p.add(f"{name}.{changed[0]}", why)

    def _check_env_run(self, p: Problems) -> None:
        pool = self.env.n_train_tasks
        if bounds.MAX_TASKS_PER_STEP >= self.rollout.tasks_per_step > pool >= 1:
            p.add(
                "rollout.tasks_per_step",
                f"{self.rollout.tasks_per_step} distinct tasks per step, but the task pool "
                f"(env.n_train_tasks) holds {pool}",
            )
        self.warm_start.check_mix(self.env.name, p)
        self._check_capabilities(p)
        if self.warm_start.teacher is not None:
            p.add("warm_start.teacher", "is for agent programs: set agent.entrypoint or command")
        if self.warm_start.hold_out_teacher_tasks:
            p.add(
                "warm_start.hold_out_teacher_tasks",
                "is for agent programs (their teacher's tasks): set agent.entrypoint or command",
            )

    def _check_capabilities(self, p: Problems) -> None:
        """The optional environment capabilities the run's strategy and estimator need
        (:mod:`turnrl.types`), checked on the environment's class when it is one (a
        factory function is checked when the run first needs the capability)."""
        from turnrl.credit import get_estimator, list_estimators
        from turnrl.envs import ENVS
        from turnrl.types import CAPABILITIES, References, Snapshots

        spec = ENVS.get(self.env.name)
        if spec is None or not isinstance(spec.make_env, type):
            return
        needed = []
        if self.rollout.strategy != "independent":
            needed.append(("rollout.strategy", Snapshots, f"{self.rollout.strategy!r}"))
        known = self.credit.estimator in list_estimators(with_aliases=True)
        if known and "info_gain" in get_estimator(self.credit.estimator).needs:
            needed.append(("credit.estimator", References, f"{self.credit.estimator!r}"))
        for key, capability, what in needed:
            if not issubclass(spec.make_env, capability):
                p.add(
                    key,
                    f"{what} needs an environment with {CAPABILITIES[capability]}; "
                    f"{self.env.name!r} ({spec.make_env.__name__}) has none",
                )

    def _check_agent_run(self, p: Problems) -> None:
        """What an ``[agent]`` run needs of the other sections (and what only it may use)."""
        from turnrl.credit import get_estimator
        from turnrl.envs import ENVS
        from turnrl.train.agent.tasks import check_task_spec, is_task_file

        warm, tasks = self.warm_start, self.tasks
        if self.train.sharding != "none":
            p.add(
                "train.sharding",
                f"{self.train.sharding!r} runs on built-in environments ([env]) only: the "
                "agent loop's gateway samples on rank 0 alone, with the learner (use 'none')",
            )
        if warm.mix == "per_draw" and warm.teacher is not None:
            # the teacher runs once per variant of tasks.train's built-in environment
            # (turnrl.train.agent.teacher_mix); without a teacher there is nothing to mix
            spec = ENVS.get(tasks.train)
            if spec is None or spec.demo_variants is None:
                p.add(
                    "warm_start.mix",
                    f"'per_draw' for an agent needs tasks.train to be a built-in environment "
                    f"with demo_variants; {tasks.train!r} is not (use 'per_task': the "
                    "teacher sets its mix)",
                )
        for name in ("train", "eval"):
            spec_text = getattr(tasks, name)
            if spec_text is not None:
                try:
                    check_task_spec(spec_text, f"tasks.{name}")
                except ValueError as err:
                    p.add(f"tasks.{name}", str(err).split(": ", 1)[1])
        if is_task_file(tasks.train) and tasks.eval is None:
            p.add(
                "tasks.eval", "needed when tasks.train is a file: the held-out tasks to evaluate on"
            )
        if not is_task_file(tasks.train) and self.rollout.tasks_per_step > tasks.n_train:
            p.add(
                "rollout.tasks_per_step",
                f"{self.rollout.tasks_per_step} distinct tasks per step, but tasks.n_train "
                f"is {tasks.n_train}",
            )
        if self.rollout.strategy != "independent":
            p.add("rollout.strategy", "agent programs run independent rollouts only")
        if self.rollout.workers > 0:
            p.add("rollout.workers", "agent programs run in this process (use agent.concurrency)")
        if "info_gain" in get_estimator(self.credit.estimator).needs:
            p.add(
                "credit.estimator",
                f"{self.credit.estimator!r} needs information gain, which needs a reference "
                "answer that agent tasks do not have",
            )
        if warm.teacher is not None and warm.init_from is not None:
            p.add("warm_start.teacher", "set either warm_start.teacher or warm_start.init_from")
        if warm.teacher is not None and not ENTRYPOINT_FORMAT.match(warm.teacher):
            p.add("warm_start.teacher", f"expected 'module:function', got {warm.teacher!r}")
        p.at_least("warm_start.teacher_tasks", warm.teacher_tasks, 0)
        p.at_most("warm_start.teacher_tasks", warm.teacher_tasks, bounds.MAX_TASK_POOL, bounds.WHY)
        if warm.hold_out_teacher_tasks:
            if warm.teacher_tasks == 0:
                p.add(
                    "warm_start.hold_out_teacher_tasks",
                    "needs warm_start.teacher_tasks > 0 (with 0 the teacher had every task)",
                )
            elif (
                not is_task_file(tasks.train)
                and tasks.n_train - warm.teacher_tasks < self.rollout.tasks_per_step
            ):
                p.add(
                    "warm_start.hold_out_teacher_tasks",
                    f"leaves {max(tasks.n_train - warm.teacher_tasks, 0)} of tasks.n_train = "
                    f"{tasks.n_train} for RL after the teacher's {warm.teacher_tasks}, fewer "
                    f"than rollout.tasks_per_step = {self.rollout.tasks_per_step}",
                )
