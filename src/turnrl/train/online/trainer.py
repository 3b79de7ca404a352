"""Online multi-turn RL on a built-in environment: rollouts -> credit -> PPO update.

What is this trainer's own: each step draws tasks, lets the rollout strategy
(``rollout.strategy``: independent samples or a tree) collect episodes in the
environment and call :meth:`OnlineTrainer.learn` (information gain if the estimator
needs it, credit with any ``turnrl.credit`` estimator, the PPO update of
:mod:`turnrl.train.update.ppo`), and logs the step. Evaluation is the same episodes,
greedy by default, on the held-out tasks. The run directory, config copy, warm
start, metrics and checkpoints are the shared run directory's
(:mod:`turnrl.train.run`), and the order of a run (start or resume, steps,
evaluations, checkpoints) is :class:`~turnrl.train.lifecycle.Lifecycle`'s, whose
:class:`~turnrl.train.lifecycle.Trainer` this class implements; this trainer adds::

    rollouts/          turn records of some steps (``log_rollouts_every``), with advantages

``resume=True`` continues a killed run from its last checkpoint; the random
streams are all derived from (seed, step) or restored from the checkpoint, so the
resumed run produces the same numbers as an uninterrupted one.

Under ``torchrun`` with several ranks, :mod:`turnrl.train.online.ranks` runs this
trainer as one rank of N through the small hooks below (``_runner``, ``_own_tasks``,
``_combine``, ``_count_reducer``, ``_write_rollouts``); in one process they change
nothing (docs/distributed.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np
import torch

from turnrl.credit import compute_credit, get_estimator
from turnrl.envs import make_env
from turnrl.errors import ConfigError, UsageError
from turnrl.io import atomic_write_text
from turnrl.policy import HFPolicy
from turnrl.policy.factory import build_sampler, close_sampler
from turnrl.policy.sync import push_weights
from turnrl.records import dumps_record
from turnrl.rollout import RolloutBatch, StrategyContext, get_strategy, run_episodes
from turnrl.rollout.context_cap import (
    TRUNCATED_AT_CONTEXT,
    cap_context,
    no_turn_fits,
    truncation_metrics,
)
from turnrl.rollout.strategies import RolloutPool, StepExperience
from turnrl.rollout.tree import physical_env_steps
from turnrl.table import TurnTable
from turnrl.train.config import RunConfig
from turnrl.train.evaluate import evaluate_in_env
from turnrl.train.lifecycle import LifecycleRun, Schedule, seed_process
from turnrl.train.metrics import advantage_metrics, episode_metrics
from turnrl.train.policy_start import start_training
from turnrl.train.run import (
    Checkpoint,
    RunDirectory,
    build_policy,
    derive_seed,
    due,
    task_split,
    with_lora,
)
from turnrl.train.update.info_gain import add_information_gain
from turnrl.train.update.legacy_pipeline import pipeline_of
from turnrl.train.update.loss import CountReducer
from turnrl.train.update.ppo import UpdateBatch, build_update_batch, ppo_update
from turnrl.train.update.sft import demonstration_examples
from turnrl.train.validate import validate
from turnrl.types import References, Task, TurnRecord, require

__all__ = ["TIMING_KEYS", "OnlineTrainer", "build_policy", "with_lora"]

TIMING_KEYS = (
    "seconds_sampling",
    "seconds_env",
    "seconds_credit",
    "seconds_update",
    "seconds_step",
)
"""Metrics that depend on the machine's speed (excluded from resume-equality checks)."""


class OnlineTrainer(LifecycleRun):
    """Runs one training job described by a ``RunConfig``.

    The config is validated and the run directory checked (``resume``: continue the
    run in it; ``overwrite``: replace it; neither: it must not hold a run) before
    anything is built or written.
    """

    SPLITS_OVER_RANKS = False
    """Whether this trainer runs as one of several torchrun ranks (see ``RunDirectory.open``)."""

    def __init__(
        self,
        config: RunConfig,
        *,
        resume: bool = False,
        overwrite: bool = False,
        quiet: bool = False,
        pool: RolloutPool | None = None,
    ) -> None:
        validate(config)
        if config.train.sharding != "none" and not self.SPLITS_OVER_RANKS:
            raise UsageError(
                f"train.sharding = {config.train.sharding!r} shards the learner over "
                "torchrun ranks; one process holds the whole model: use 'none' (a run may "
                "change it on --resume)"
            )
        if config.rollout.workers > 0 and pool is None and not self.SPLITS_OVER_RANKS:
            raise ValueError(
                "rollout.workers > 0 needs a rollout pool: run it with "
                "turnrl.integrations.ray_workers.train_with_workers"
            )
        self.config = config
        self.run_directory = RunDirectory.open(
            config,
            resume=resume,
            overwrite=overwrite,
            keep_checkpoints=config.train.keep_checkpoints,
            quiet=quiet,
            split_over_ranks=self.SPLITS_OVER_RANKS,
        )
        self.run_dir = self.run_directory.path
        self.quiet = quiet
        env = config.env
        tasks = task_split(env)
        self.train_tasks = tasks.train
        self.eval_tasks = tasks.eval
        self.eval_unseen = tasks.eval_unseen
        self.tasks_by_id = {t.task_id: t for t in self.train_tasks}
        self._reference_env = make_env(env.name, **env.env_kwargs)
        seed_process(config.train.seed, config.train.threads)
        self.policy = build_policy(config.policy, config.train.seed)
        self.reference: HFPolicy | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.sampler = np.random.default_rng(config.train.seed)
        self.step = 0
        self.env_steps = 0
        """Cumulative agent turns taken in training environments."""
        self.tokens = 0
        """Cumulative tokens sampled in training."""
        self.pool = pool
        """Runs the independent strategy's episodes elsewhere (``rollout.workers``); it gets
        the weights before the first step and after every update."""
        self.policy_version = 0
        """Updates applied so far: the version of the weights pushed to ``pool``."""
        self.rollout_policy: Any = None
        """What rollouts sample with (``policy.backend``): the learner itself, or a vLLM
        engine that gets the learner's weights after every update (set up in ``setup``)."""
        self.learned: dict[tuple[str, int], tuple[TurnRecord, float]] = {}
        """This step's rows that credit was computed on, by ``(traj_id, turn)``: the record
        credit saw (with ``info_gain`` when computed) and its advantage, for the log."""

    # ------------------------------------------------------------------ set-up
    def _make_env(self):
        return make_env(self.config.env.name, **self.config.env.env_kwargs)

    def _reference_response(self, task_id: str) -> str | None:
        task = self.tasks_by_id.get(task_id)
        env = require(self._reference_env, References, "information gain (credit.estimator)")
        return None if task is None else env.reference_response(task)

    def _demonstrations(self) -> list[Any]:
        cfg = self.config
        return demonstration_examples(
            self.policy,
            cfg.env.name,
            self.train_tasks,
            seed=cfg.train.seed,
            tool_fraction=cfg.warm_start.tool_fraction,
            easy_tool_fraction=cfg.warm_start.easy_tool_fraction,
            env_kwargs=cfg.env.env_kwargs,
            mix=cfg.warm_start.mix,
        )

    @property
    def schedule(self) -> Schedule:
        cfg = self.config.train
        return Schedule(cfg.steps, cfg.eval_every, cfg.checkpoint_every, label="RL")

    def setup(self, checkpoint: Checkpoint | None) -> int:
        """Start the run: a fresh warm start, or the state of ``checkpoint``."""
        start = start_training(
            self.run_directory,
            checkpoint,
            self.policy,
            self.config,
            self._demonstrations,
            self.sampler,
        )
        self.policy, self.reference, self.optimizer = start.policy, start.reference, start.optimizer
        if checkpoint is not None:
            self.step = checkpoint.step
            self.env_steps = int(checkpoint.extra["env_steps"])
            self.tokens = int(checkpoint.extra["tokens"])
            self.policy_version = int(checkpoint.extra.get("policy_version", self.step))
        self.rollout_policy = self._build_rollout_policy()
        self._push_weights()
        return self.step

    def _build_rollout_policy(self) -> Any:
        """What this process samples with (``policy.backend``), sized for its largest
        sampling call: a step's groups, or the evaluation."""
        cfg = self.config
        rows = max(cfg.rollout.tasks_per_step * cfg.rollout.group_size, cfg.env.n_eval_tasks)
        return build_sampler(cfg.policy, self.policy, rows=rows)

    def _push_weights(self) -> None:
        """The learner's weights, as ``policy_version``, to every sampler that is not it."""
        push_weights(self.policy, self.rollout_policy, self.policy_version)
        if self.pool is not None:
            push_weights(self.policy, self.pool, self.policy_version)

    def checkpoint(self) -> None:
        """The weights, optimiser, task sampler and counters after the last step."""
        self.run_directory.save_checkpoint(
            self.step,
            *self._saved_state(),
            {
                "sampler": self.sampler.bit_generator.state,
                "env_steps": self.env_steps,
                "tokens": self.tokens,
                "policy_version": self.policy_version,
            },
        )

    def _saved_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The learner's and the optimiser's state dicts as a checkpoint holds them."""
        assert self.optimizer is not None
        return self.policy.state_dict(), self.optimizer.state_dict()

    # --------------------------------------------------------------- one step
    def evaluate(self) -> dict[str, float]:
        """Success and tool use on the held-out tasks (greedy by default), as ``turnrl
        eval`` computes them (:func:`~turnrl.train.evaluate.evaluate_in_env`)."""
        cfg = self.config
        self.policy.model.eval()
        evaluation = evaluate_in_env(
            self.rollout_policy,
            self._make_env,
            self.eval_tasks,
            samples=cfg.train.eval_samples,
            temperature=cfg.train.eval_temperature,
            max_new_tokens=cfg.policy.max_new_tokens,
            max_context_tokens=cfg.rollout.max_context_tokens,
        )
        return {**evaluation.metrics, "eval_unseen": self.eval_unseen}

    def update(self, batch: UpdateBatch) -> dict[str, float]:
        """Several epochs of mini-batch PPO-clip steps on one batch of turns."""
        assert self.optimizer is not None
        return ppo_update(
            self.policy,
            self.optimizer,
            batch,
            self.config.train,
            temperature=self.config.policy.temperature,
            reference=self.reference,
            seed=derive_seed(self.config.train.seed, "update", self.step),
        )

    def learn(self, records: list[TurnRecord]) -> dict[str, float]:
        """Credit on ``records`` (one row per turn), then a PPO-clip update on them."""
        cfg = self.config
        if not records and cfg.rollout.max_context_tokens > 0:
            raise ConfigError(no_turn_fits(cfg.rollout.max_context_tokens, self.step))
        t0 = time.perf_counter()
        if "info_gain" in get_estimator(cfg.credit.estimator).needs:
            self.policy.model.eval()
            scorer = self._whole_policy()
            records = add_information_gain(scorer, records, self._reference_response)
        table = TurnTable.from_records(records, source=f"step {self.step}")
        credit = compute_credit(table, cfg.credit.estimator, **cfg.credit.params)
        seconds_credit = time.perf_counter() - t0
        for record, advantage in zip(records, credit.advantages, strict=True):
            self.learned[(record.traj_id, record.turn)] = (record, float(advantage))
        t0 = time.perf_counter()
        update = build_update_batch(
            records,
            table,
            credit.advantages,
            credit.clip_factor,
            cfg.train.aggregation,
            reduce_count=self._count_reducer(),
            legacy=pipeline_of(cfg.train, cfg.rollout.tasks_per_step, cfg.rollout.group_size),
            legacy_seed=derive_seed(cfg.train.seed, "update", self.step),
        )
        losses = self.update(update)
        self.policy_version += 1
        self._push_weights()
        return {
            **advantage_metrics(table, credit.advantages, cfg.credit.estimator),
            **losses,
            "seconds_credit": seconds_credit,
            "seconds_update": time.perf_counter() - t0,
        }

    def start_metrics(self) -> dict[str, Any]:
        """The warm start's evaluation (the step-0 row)."""
        return self.evaluate()

    def train_step(self, step: int | None = None) -> dict[str, Any]:
        """Run step ``step`` (default: the one after the last): draw tasks, let the rollout
        strategy collect and learn, return the step's metrics."""
        cfg = self.config
        started = time.perf_counter()
        self.step = self.step + 1 if step is None else step
        self.learned = {}
        picks = self.sampler.choice(
            len(self.train_tasks), cfg.rollout.tasks_per_step, replace=False
        )
        tasks = [self.train_tasks[i] for i in picks]
        self.policy.model.eval()
        context = StrategyContext(
            policy=cap_context(self.rollout_policy, cfg.rollout.max_context_tokens),
            make_env=self._make_env,
            max_new_tokens=cfg.policy.max_new_tokens,
            temperature=cfg.policy.temperature,
            learn=self.learn,
            seed=derive_seed(cfg.train.seed, "rollout", self.step),
            traj_prefix=f"s{self.step}-",
            runner=self._runner(tasks),
        )
        strategy = get_strategy(cfg.rollout.strategy)
        experience = self._combine(
            strategy(context, self._own_tasks(tasks), cfg.rollout.group_size, **cfg.rollout.params)
        )
        batch = experience.batch
        if due(self.step, cfg.train.log_rollouts_every):
            self._write_rollouts(batch.records)
        self.env_steps += physical_env_steps(batch.records)
        self.tokens += batch.sampled_tokens
        learned = _mean_stats(experience.learn_stats)
        capped = cfg.rollout.max_context_tokens > 0
        ends = [e.end == TRUNCATED_AT_CONTEXT for e in batch.episodes]
        return {
            "step": self.step,
            "episodes": len(batch.episodes),
            "env_steps": self.env_steps,
            "tokens": self.tokens,
            **episode_metrics(batch.episodes),
            **(truncation_metrics(ends) if capped else {}),
            **learned,
            **experience.extra,
            "seconds_sampling": batch.seconds_sampling,
            "seconds_env": batch.seconds_env,
            "seconds_step": time.perf_counter() - started,
        }

    # ------------------------------------------------- hooks of a split learner
    # One process: the identity. turnrl.train.online.ranks overrides them to
    # split a step's tasks over torchrun ranks.
    def _runner(self, tasks: list[Task]) -> Callable[..., RolloutBatch]:
        """What runs the independent strategy's episodes of the step's ``tasks``."""
        if self.pool is not None:
            return self.pool.run_episodes
        if self.config.rollout.per_episode_seeds:
            return partial(run_episodes, per_episode_seeds=True)
        return run_episodes

    def _own_tasks(self, tasks: list[Task]) -> list[Task]:
        """The tasks of the step this process collects and learns from."""
        return tasks

    def _combine(self, experience: StepExperience) -> StepExperience:
        """The step's experience of every process, from this process's."""
        return experience

    def _count_reducer(self) -> CountReducer | None:
        """The global batch's loss normaliser from this process's (None: its own)."""
        return None

    def _whole_policy(self) -> HFPolicy:
        """The learner's current weights for forwards outside the update (information
        gain): the learner itself, or its whole copy when ranks shard it."""
        return self.policy

    def _write_rollouts(self, records: list[TurnRecord]) -> None:
        """Write the step's records with their advantages to ``rollouts/``."""
        path = self.run_dir / "rollouts" / f"step-{self.step:06d}.jsonl"
        path.parent.mkdir(exist_ok=True)
        atomic_write_text(path, rollout_log(records, self.learned))

    # -------------------------------------------------------------------- run
    def describe(self, row: Mapping[str, Any]) -> str:
        """The progress bar's line for a step."""
        parts = [f"RL step {row['step']}", f"success {row.get('success', 0):.2f}"]
        if "tool_rate_hard" in row:
            parts.append(f"tool(hard) {row['tool_rate_hard']:.2f}")
        parts.append(f"turns {row.get('turns', 0):.2f}")
        return "  ".join(parts)

    def close(self) -> None:
        """Close the sampler (a vLLM engine's core, #26), also after an error; then release
        the run directory's lock."""
        try:
            close_sampler(self.policy, self.rollout_policy)
        finally:
            super().close()


def rollout_log(
    records: list[TurnRecord], learned: dict[tuple[str, int], tuple[TurnRecord, float]]
) -> str:
    """JSONL text of a step's records, each with the ``advantage`` it was trained with.

    Rows credit was computed on are written as credit saw them (``info_gain``
    included); rows no ``learn`` call saw (tree rows that are never updated on,
    RTPO positions skipped for ties) get advantage 0.
    """
    lines = []
    for record in records:
        seen, advantage = learned.get((record.traj_id, record.turn), (record, 0.0))
        lines.append(dumps_record(seen, advantage=advantage) + "\n")
    return "".join(lines)


def _mean_stats(stats: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each statistic over several learn calls; seconds and token counts are
    summed, peak memory is the largest."""
    keys = sorted({k for s in stats for k in s})
    out = {}
    for key in keys:
        values = [s[key] for s in stats if key in s]
        if key.startswith(("seconds_", "update_tokens_")):
            out[key] = float(np.sum(values))
        elif key.endswith("_mib"):
            out[key] = float(np.max(values))
        else:
            out[key] = float(np.mean(values))
    return out
