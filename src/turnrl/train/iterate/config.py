"""Typed configuration of ``turnrl iterate`` (Iterative GRPO), read like ``RunConfig``.

Sections reuse the online trainer's where they mean the same thing (``policy``);
the environment and warm-start sections extend theirs with what batch-online
training adds (no environment at all when training from logs only; the style of
negotiation demonstrations). Every field carries a docstring, so
``config_to_toml_text`` writes a self-documenting copy into the run directory; every
section checks its values in its ``check`` method (:mod:`turnrl.train.validate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from turnrl.train.sections import (
    Aggregation,
    EnvConfig,
    LoggingConfig,
    PolicyConfig,
    PPOConfig,
    WarmStartConfig,
    check_update_precision,
)
from turnrl.train.validate import Problems


@dataclass
class IterateEnvConfig(EnvConfig):
    """The environment policies are deployed in (and evaluated on)."""

    ALLOW_NO_ENV: ClassVar[bool] = True

    name: str = "haggle"
    """Registered environment name (see ``turnrl.envs``). Empty (``""``) means no
    environment: only ``--from-logs`` training, which stops after the first
    improvement (nothing to deploy the improved policy in)."""


@dataclass
class IterateWarmStartConfig(WarmStartConfig):
    """Supervised warm start before the first deployment."""

    style: str | None = "weak"
    """Demonstration style for settings that have several (negotiation:
    ``weak``/``medium``/``strong``); ignored (set to none) for others. With
    ``--from-logs`` and no environment, the warm start imitates the logged
    assistant turns instead (behaviour cloning of the logging policy)."""
    persona_styles: dict[str, str] = field(default_factory=dict)
    """Extra demonstrations under exploration personas: instruction -> demonstration
    style (negotiation settings only), e.g. ``{ "Negotiate hard." = "strong" }`` adds
    one ``strong`` demonstration per training task whose system message carries the
    instruction. Teaches a tiny model to follow ``deploy.personas`` the way an
    instruction-tuned LLM follows a tone or strategy instruction."""

    def check(self, p: Problems) -> None:
        from turnrl.envs.negotiation import STYLES

        if self.style is not None:
            p.one_of("style", self.style, STYLES)
        for instruction, style in self.persona_styles.items():
            if style not in STYLES:
                p.add(
                    f"persona_styles[{instruction!r}]",
                    f"unknown style {style!r}; allowed: {', '.join(STYLES)}",
                )
        super().check(p)


@dataclass
class DeployConfig:
    """Step 1, deploy: conversations collected with the current policy each iteration."""

    tasks_per_iteration: int = 16
    """Distinct tasks (counterpart personas) drawn from the training pool per iteration."""
    conversations_per_task: int = 4
    """Conversations per task; the batch has ``tasks_per_iteration * conversations_per_task``."""
    temperatures: list[float] = field(default_factory=lambda: [1.0])
    """Exploration: conversations are split evenly over these sampling temperatures
    (e.g. ``[0.7, 1.0, 1.3]`` varies how adventurous the deployed policy is)."""
    personas: list[str] = field(default_factory=lambda: [""])
    """Exploration personas: instructions appended to the system message the policy
    reads (``""`` = none), e.g. ``["", "Open high and concede slowly."]``.
    Conversations are split evenly over every (temperature, persona) pair. The
    counterpart never sees the instruction and the logs hold the state without it
    (``turnrl.train.iterate.explore``)."""

    def check(self, p: Problems) -> None:
        p.at_least("tasks_per_iteration", self.tasks_per_iteration, 1)
        p.at_least("conversations_per_task", self.conversations_per_task, 1)
        if not self.temperatures:
            p.add("temperatures", "must list at least one temperature")
        for i, temperature in enumerate(self.temperatures):
            p.at_least(f"temperatures[{i}]", temperature, 0)
        if not self.personas:
            p.add("personas", 'must list at least one entry ("" = no persona)')


@dataclass
class QConfig:
    """Step 2, evaluate: the turn-level Q model fitted to Monte Carlo returns."""

    gamma: float = 1.0
    """Discount of the Monte Carlo return ``G_t = sum_j gamma^j r_{t+j}``."""
    init: Literal["fresh", "policy"] = "fresh"
    """``fresh``: a new tiny Qwen2 backbone; ``policy``: a copy of the deployed policy's
    transformer (a head on the policy backbone, trained separately)."""
    hidden: int = 64
    """Hidden size of a ``fresh`` Q backbone."""
    layers: int = 2
    """Layers of a ``fresh`` Q backbone."""
    loss: Literal["mse", "bce", "auto"] = "auto"
    """``mse``, ``bce`` (0/1 returns) or ``auto`` (BCE when every return is 0 or 1)."""
    steps: int = 300
    """AdamW steps of each fit."""
    lr: float = 1e-3
    """Learning rate of the Q fit."""
    batch_size: int = 32
    """Logged turns per Q-fit step."""
    holdout_fraction: float = 0.2
    """Share of conversations held out to measure Q (never trained on)."""
    calibration_bins: int = 10
    """Equal-count bins of the reliability table and ECE."""
    refit: bool = True
    """Start every iteration's Q from scratch (True, a fit of Q^pi for the new pi), or
    continue from the previous iteration's weights (False)."""

    def check(self, p: Problems) -> None:
        p.within("gamma", self.gamma, 0.0, 1.0)
        p.at_least("hidden", self.hidden, 1)
        p.at_least("layers", self.layers, 1)
        p.at_least("steps", self.steps, 0)
        p.above("lr", self.lr, 0)
        p.at_least("batch_size", self.batch_size, 1)
        if not 0 <= self.holdout_fraction < 1:
            p.add("holdout_fraction", f"must be in [0, 1), got {self.holdout_fraction!r}")
        p.at_least("calibration_bins", self.calibration_bins, 1)


@dataclass
class ImproveConfig(PPOConfig):
    """Step 3, improve: single-turn GRPO on logged states with Q as the reward model
    (the PPO fields as in ``[train]``; one optimiser for the whole run)."""

    epochs: int = 2
    """PPO epochs over each step's candidates."""
    minibatch_size: int = 64
    """Candidates per optimiser step."""
    kl_coef: float = 0.05
    """Weight of the KL penalty to the policy deployed this iteration."""
    aggregation: Aggregation = "token-mean"
    """Loss aggregation: ``token-mean`` or ``seq-mean-token-mean`` (each candidate is its
    own one-turn rollout, so ``rollout-mean`` equals ``seq-mean-token-mean``)."""
    steps: int = 8
    """GRPO steps per iteration (each samples fresh candidates from the current policy)."""
    states_per_step: int = 16
    """Logged turns (states) drawn per step, without replacement within the step."""
    candidates: int = 8
    """Candidate responses sampled per state (the group size G)."""
    temperature: float = 1.0
    """Sampling temperature of candidates (the PPO ratio uses the same)."""
    use_std: bool = True
    """Divide by the group's std in the ``q`` estimator (mean-only when False)."""
    std_floor: float = 0.0
    """Divide by ``max(std, std_floor)`` instead (not in the paper; 0 = the paper's
    plain std). In return units: differences between candidates far below Q's error
    then stay small advantages instead of being scaled up to about +-1."""
    reject_malformed: bool = True
    """Score candidates that are no well-formed action of the environment (its pure
    ``check_response`` syntax check, no environment call) ``malformed_score``
    instead of by Q (not in the paper: Q has no data on malformed near-copies of good
    moves and the policy learns to exploit that). Needs an environment."""
    malformed_score: float | None = None
    """Score of a rejected candidate; none: the lowest Monte Carlo return-to-go of any
    turn logged in the iteration (the worst outcome seen)."""

    def check(self, p: Problems) -> None:
        p.at_least("steps", self.steps, 1)
        p.at_least("states_per_step", self.states_per_step, 1)
        p.at_least("candidates", self.candidates, 1)
        p.above("temperature", self.temperature, 0)
        p.at_least("std_floor", self.std_floor, 0)
        if self.malformed_score is not None:
            p.finite("malformed_score", self.malformed_score)
        if self.aggregation == "legacy-verl":
            p.add(
                "aggregation",
                "'legacy-verl' models turnrl train's step (its [train].legacy_* "
                "fields); turnrl iterate's improvement update has no such pipeline",
            )
        super().check(p)


@dataclass
class IterateEvalConfig:
    """Held-out evaluation after each iteration (same protocol as ``turnrl train``)."""

    temperature: float = 0.0
    """Sampling temperature of evaluation; 0 is greedy."""
    samples: int = 1
    """Conversations per held-out task."""

    def check(self, p: Problems) -> None:
        p.at_least("temperature", self.temperature, 0)
        p.at_least("samples", self.samples, 1)


@dataclass
class IterateConfig:
    """A complete Iterative GRPO run: deploy, evaluate (fit Q), improve, repeat."""

    MAY_CHANGE_ON_RESUME: ClassVar[tuple[str, ...]] = (
        "run_dir",
        "label",
        "iterations",
        "threads",
        "keep_checkpoints",
        "save_policies",
        "improve.gradient_checkpointing",
        "improve.logprob_chunk_tokens",
        "logging.trackers",
        "logging.project",
        "logging.offline",
        "logging.report",
    )
    """Fields a resumed run may change (``--resume``); any other difference from the
    run's ``config.toml`` is refused."""

    run_dir: str = "runs/iterate"
    """Directory for metrics, logged conversations, Q models and policies."""
    label: str | None = None
    """Name of this run in reports (runs sharing a label are seeds of one method)."""
    iterations: int = 4
    """Number of deploy -> evaluate -> improve rounds."""
    seed: int = 0
    """Seed of initialisation, task draws, sampling and splits."""
    threads: int = 0
    """Torch intra-op threads; 0 keeps torch's default."""
    keep_checkpoints: int = 2
    """Checkpoints kept in ``checkpoints/`` (one per finished iteration; older deleted)."""
    save_policies: bool = True
    """Save the improved policy of every iteration (``iter-NNN/policy``); the last one is
    always exported as ``policy/`` (docs/export.md)."""
    env: IterateEnvConfig = field(default_factory=IterateEnvConfig)
    """Environment section."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """Policy section."""
    warm_start: IterateWarmStartConfig = field(default_factory=IterateWarmStartConfig)
    """Warm-start (SFT) section."""
    deploy: DeployConfig = field(default_factory=DeployConfig)
    """Deployment (data collection) section."""
    q: QConfig = field(default_factory=QConfig)
    """Q-model (policy evaluation) section."""
    improve: ImproveConfig = field(default_factory=ImproveConfig)
    """Policy-improvement section."""
    eval: IterateEvalConfig = field(default_factory=IterateEvalConfig)
    """Held-out evaluation section."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Experiment trackers that receive every metrics row (docs/trackers.md)."""

    def check(self, p: Problems) -> None:
        """What the sections need of each other."""
        from turnrl.envs.negotiation import SETTINGS

        if self.policy.backend != "hf":
            p.add("policy.backend", "Iterative GRPO samples with the 'hf' backend only")
        p.at_least("iterations", self.iterations, 0)
        p.at_least("threads", self.threads, 0)
        if self.warm_start.teacher is not None:
            p.add("warm_start.teacher", "is for agent programs (turnrl train with [agent])")
        p.at_least("keep_checkpoints", self.keep_checkpoints, 1)
        if not self.run_dir:
            p.add("run_dir", "must name a directory")
        check_update_precision(self.policy, self.improve, "improve", p)
        if not self.env.name:
            return
        self.warm_start.check_mix(self.env.name, p)
        pool = self.env.n_train_tasks
        if self.deploy.tasks_per_iteration > pool >= 1:
            p.add(
                "deploy.tasks_per_iteration",
                f"{self.deploy.tasks_per_iteration} distinct tasks per iteration, but the "
                f"task pool (env.n_train_tasks) holds {pool}",
            )
        if self.warm_start.persona_styles and self.env.name not in SETTINGS:
            p.add(
                "warm_start.persona_styles",
                f"needs a negotiation setting ({', '.join(sorted(SETTINGS))}), "
                f"not env.name = {self.env.name!r}",
            )
