"""``turnrl train`` on a built-in environment, over the ranks torchrun started.

One run, N processes (docs/distributed.md). Every rank holds the whole model and
draws the same tasks for a step (the sampler is seeded from the config and
restored from the checkpoint identically everywhere); rank ``r`` then samples and
learns from its contiguous share of them (:func:`turnrl.train.distributed.owned_slice`),
whole task groups, so credit needs nothing from other ranks. The update is the one
of :func:`turnrl.train.update.ppo.ppo_update` with an :class:`~turnrl.train.update.ppo.UpdateShard`:
the mini-batch plan is drawn over the global batch in one process's row order, the
loss weights use the global normaliser, and the gradients are summed over ranks
before the clip and the optimiser step. So N ranks compute what one process computes
on the same global batch, up to float summation order.

Sampling is made rank-invariant by ``rollout.per_episode_seeds = true`` (required):
episode ``k`` of a step draws from ``episode_seed(step seed, k)``, whichever rank runs
it. A single process with the same flag is the reference run; without the flag one
process samples the whole batch from one generator (today's default, unchanged).

Rank 0 alone reads and writes the run directory (config, warm start, metrics,
rollouts, checkpoints; the CLI adds the report) and evaluates; it hands the other
ranks the starting state (weights, the KL reference, optimiser state, counters,
sampler and RNG states) by broadcast, so they need no shared filesystem. At the end
of a step every rank's episodes, records, advantages and counts are gathered, so the
metrics row is the global batch's.

With ``train.sharding = "fsdp2"`` the learner is sharded over the ranks
(:mod:`turnrl.train.fsdp`): a whole copy, gathered after every update, samples,
evaluates and is saved; the update pads ranks with fewer forwards. With
``rollout.workers`` rank 0 runs each step's episodes on its Ray pool and hands every
rank the episodes of its tasks (:meth:`DistributedOnlineTrainer._pool_share`).

Not supported under torchrun yet (refused with one line): tree rollout strategies
(RTPO learns once per turn position, a count that differs between ranks). The agent
loop runs over ranks too
(:mod:`turnrl.train.agent.distributed`;
:func:`turnrl.train.online.rank_entry.train_distributed` starts either), and
so does ``turnrl iterate`` (:mod:`turnrl.train.iterate.distributed`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from turnrl.errors import UsageError
from turnrl.policy import HFPolicy
from turnrl.policy.factory import build_sampler
from turnrl.policy.sync import push_weights
from turnrl.rollout import RolloutBatch
from turnrl.rollout.runner import plan_episodes, run_planned_episodes
from turnrl.rollout.strategies import RolloutPool, StepExperience
from turnrl.rollout.tokens import token_metrics
from turnrl.table import TurnTable
from turnrl.train import distributed as dist
from turnrl.train.config import RunConfig
from turnrl.train.fsdp import ShardedLearner, shard_optimizer
from turnrl.train.metrics import advantage_metrics
from turnrl.train.online.trainer import OnlineTrainer
from turnrl.train.run import Checkpoint, RunDirectory, derive_seed, initial_policy
from turnrl.train.update.loss import CountReducer
from turnrl.train.update.ppo import UpdateBatch, UpdateShard, ppo_update, trainable_rows
from turnrl.types import Task, TurnRecord

EXIT_RANK_LOST = dist.EXIT_RANK_LOST
"""Exit status of a rank whose run ended because another rank stopped."""


def check_supported(config: RunConfig, world: dist.World) -> None:
    """Refuse, with one line, what N ranks do not run yet."""
    n = f"under torchrun with {world.size} ranks"
    if config.agent.enabled:
        raise UsageError(
            "the agent loop ([agent]) runs over ranks as turnrl.train.agent.distributed, "
            "not as this environment trainer"
        )
    if config.rollout.strategy != "independent":
        raise UsageError(
            f"rollout.strategy = {config.rollout.strategy!r} does not run {n} yet; only "
            "'independent' does"
        )
    if not config.rollout.per_episode_seeds:
        raise UsageError(
            f"{n}, every rank samples its own episodes: set rollout.per_episode_seeds = true "
            "(the run then equals one process with that setting)"
        )
    dist.owned_slice(config.rollout.tasks_per_step, world)


class _RankRun(RunDirectory):
    """The run directory as a rank other than 0 sees it: it writes nothing."""

    def start(self) -> None:
        return None  # rank 0 starts the directory and broadcasts the state it resumes

    def append_metrics(self, row: Any) -> None:
        return None

    def save_checkpoint(self, step: int, *args: Any, **kwargs: Any) -> Path:
        return self.path

    def export_policy(self, step: int, *, final: bool = False) -> Path:
        return self.path

    def progress(self, *, enabled: bool = True) -> Any:
        return super().progress(enabled=False)

    def log(self, message: str) -> None:
        return None


class DistributedOnlineTrainer(OnlineTrainer):
    """:class:`~turnrl.train.online.trainer.OnlineTrainer` as one of ``world.size`` ranks."""

    SPLITS_OVER_RANKS = True

    def __init__(
        self,
        config: RunConfig,
        world: dist.World,
        *,
        resume: bool = False,
        overwrite: bool = False,
        quiet: bool = False,
        pool_factory: Callable[[RunConfig], RolloutPool] | None = None,
    ) -> None:
        self.world = world

        def start() -> None:
            check_supported(config, world)
            if config.rollout.workers > 0 and pool_factory is None:
                raise UsageError(
                    "rollout.workers > 0 under torchrun needs a rollout pool on rank 0 "
                    "(turnrl train builds it; from Python pass pool_factory, e.g. "
                    "turnrl.integrations.ray_workers.pool_for_config)"
                )
            OnlineTrainer.__init__(self, config, resume=resume, overwrite=overwrite, quiet=quiet)

        # Every rank checked the directory before rank 0 writes anything; any rank's
        # refusal stops all of them with the same line.
        dist.all_agree(start, world)
        if not world.main:
            d = self.run_directory
            self.run_directory = _RankRun(
                d.path,
                config,
                resuming=d.resuming,
                clear=False,
                keep_checkpoints=d.keep_checkpoints,
                quiet=True,
            )
        self._records: list[TurnRecord] = []
        self._episode_index: dict[str, int] = {}
        if world.main and config.rollout.workers > 0:
            assert pool_factory is not None
            # started after every rank's checks; its workers start at the first push
            self.pool = pool_factory(config)
        self._ranks_ready = False
        """Set at the end of :meth:`setup`: pushes from then on are every rank's."""
        self.sharded: ShardedLearner | None = None
        """With ``train.sharding = "fsdp2"`` (after ``setup``): the sharded learner and the
        whole copy that samples (:mod:`turnrl.train.fsdp`)."""

    # ------------------------------------------------------------------ set-up
    def setup(self, checkpoint: Checkpoint | None) -> int:
        """Rank 0 starts or resumes the run; every rank then takes its state."""
        cfg = self.config
        if self.world.main:
            super().setup(checkpoint)
        else:
            self.policy = initial_policy(self.policy, cfg.warm_start, cfg.policy)
            self.reference = self.policy.clone_frozen() if cfg.train.kl_coef > 0 else None
            self.optimizer = torch.optim.AdamW(
                self.policy.parameters(), lr=cfg.train.lr, weight_decay=0.0
            )
        self._share_state()
        whole: HFPolicy = self.policy
        if cfg.train.sharding == "fsdp2":
            assert self.optimizer is not None
            self.sharded = ShardedLearner.shard(self.policy)
            self.optimizer = shard_optimizer(self.optimizer, list(self.policy.parameters()))
            whole = self.sharded.full
        # rank 0's sampler (and pool) got the weights in the one-process set-up, before
        # the state was shared; the whole copy holds them already (copied before sharding)
        if not self.world.main:
            self.rollout_policy = build_sampler(cfg.policy, whole)
            if self._one_server():  # rank 0 has pushed to it already
                self.rollout_policy.follow_learner(whole, self.policy_version)
            else:
                push_weights(whole, self.rollout_policy, self.policy_version)
        elif self.rollout_policy is self.policy:
            self.rollout_policy = whole
        self._ranks_ready = True
        return self.step

    def _one_server(self) -> bool:
        """Whether every rank samples on one vLLM server (``policy.backend =
        "vllm-server"``), which holds one set of weights for all of them."""
        return self.world.split and hasattr(self.rollout_policy, "follow_learner")

    def _push_weights(self) -> None:
        """Sharded: every rank gathers the learner whole into its sampling copy, which
        then pushes to the samplers that are not it. On one vLLM server rank 0 alone
        pushes, and the other ranks take the version once it has (every rank pushing
        would reload the weights under the others' requests, and unload the previous
        adapter twice): :func:`~turnrl.train.distributed.on_main` waits for rank 0 and
        raises its error on every rank. Rank 0's push during its one-process set-up
        (before the state is shared) is its own; the others follow in :meth:`setup`."""
        if self.sharded is not None:
            self.sharded.gather()
        learner = self._whole_policy()
        version = self.policy_version
        if self._ranks_ready and self._one_server():
            dist.on_main(lambda: push_weights(learner, self.rollout_policy, version), self.world)
            if not self.world.main:
                self.rollout_policy.follow_learner(learner, version)
        else:
            push_weights(learner, self.rollout_policy, version)
        if self.pool is not None:
            push_weights(learner, self.pool, version)

    def _whole_policy(self) -> HFPolicy:
        return self.policy if self.sharded is None else self.sharded.full

    def _saved_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Sharded: the whole copy's weights and the optimiser state gathered whole (every
        rank takes part; rank 0 writes): the format of one process."""
        if self.sharded is None:
            return super()._saved_state()
        assert self.optimizer is not None
        optimizer = self.sharded.full_optimizer_state(self.optimizer)
        return self.sharded.full.state_dict(), optimizer

    def _share_state(self) -> None:
        assert self.optimizer is not None
        models = [self.policy.model] + ([] if self.reference is None else [self.reference.model])
        counters = {
            "sampler": self.sampler.bit_generator.state,
            "counters": (self.step, self.env_steps, self.tokens, self.policy_version),
        }
        counters = dist.share_start_state(self.world, models, self.optimizer, counters)
        if not self.world.main:
            self.sampler.bit_generator.state = counters["sampler"]
            self.step, self.env_steps, self.tokens, self.policy_version = counters["counters"]

    # ------------------------------------------------------- the split step
    def _runner(self, tasks: list[Task]) -> Callable[..., RolloutBatch]:
        """Runs this rank's episodes of the step's plan over all ``tasks``, each with its
        own seed from its index in that plan (as one process with per-episode seeds)."""
        owned = dist.owned_slice(len(tasks), self.world)

        def run(
            policy: Any,
            make_env: Callable[[], Any],
            own_tasks: list[Task],
            *,
            group_size: int,
            max_new_tokens: int,
            temperature: float,
            seed: int,
            traj_prefix: str = "",
            max_turns: int = 32,
        ) -> RolloutBatch:
            assert list(own_tasks) == tasks[owned], "a strategy ran other tasks than its own"
            plan = plan_episodes(tasks, group_size, traj_prefix)
            self._episode_index = {traj: k for k, (_, traj) in enumerate(plan)}
            if self.config.rollout.workers > 0:
                return self._pool_share(
                    tasks,
                    group_size=group_size,
                    max_new_tokens=max_new_tokens,
                    temperature=temperature,
                    seed=seed,
                    traj_prefix=traj_prefix,
                    max_turns=max_turns,
                )
            planned = [
                (k, task, traj)
                for k, (task, traj) in enumerate(plan)
                if owned.start <= k // group_size < owned.stop
            ]
            return run_planned_episodes(
                policy,
                make_env,
                planned,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                seed=seed,
                max_turns=max_turns,
            )

        return run

    def _pool_share(self, tasks: list[Task], *, group_size: int, **options: Any) -> RolloutBatch:
        """This rank's episodes of the step, sampled on rank 0's Ray pool: rank 0 runs the
        whole plan there (the episodes each rank would sample itself, same seeds) and
        hands rank ``r`` the episodes of its tasks (whole task groups) by scatter. The
        step's token counts and seconds go with rank 0's share (the others' are 0): the
        step's metrics are their sums and maxima over ranks."""
        shares = None
        if self.world.main:
            assert self.pool is not None
            whole = self.pool.run_episodes(
                self.rollout_policy, self._make_env, tasks, group_size=group_size, **options
            )
            shares = [
                self._share_of(whole, len(tasks), group_size, rank)
                for rank in range(self.world.size)
            ]
        return dist.scatter_objects(shares, self.world)

    def _share_of(
        self, whole: RolloutBatch, tasks: int, group_size: int, rank: int
    ) -> RolloutBatch:
        """Rank ``rank``'s episodes and records of ``whole`` (in ``whole``'s order)."""
        owned = dist.owned_slice(tasks, dist.World(rank, self.world.size, rank))

        def mine(traj_id: str) -> bool:
            return owned.start <= self._episode_index[traj_id] // group_size < owned.stop

        if rank > 0:
            totals: dict[str, Any] = {}
        else:
            totals = {
                "sampled_tokens": whole.sampled_tokens,
                "context_tokens": whole.context_tokens,
                "seconds_sampling": whole.seconds_sampling,
                "seconds_env": whole.seconds_env,
                "extra": dict(whole.extra),
            }
        return RolloutBatch(
            records=[r for r in whole.records if mine(r.traj_id)],
            episodes=[dataclasses.replace(e, env=None) for e in whole.episodes if mine(e.traj_id)],
            **totals,
        )

    def _own_tasks(self, tasks: list[Task]) -> list[Task]:
        return tasks[dist.owned_slice(len(tasks), self.world)]

    def _order_key(self, record: TurnRecord) -> tuple[int, int]:
        """Where one process puts ``record`` in the step's batch: turn by turn, episodes in
        plan order (what :func:`turnrl.rollout.runner.run_episodes` appends)."""
        return record.turn, self._episode_index[record.traj_id]

    def _count_reducer(self) -> CountReducer | None:
        return lambda count: dist.sum_over_ranks(count, self.world)

    def learn(self, records: list[TurnRecord]) -> dict[str, float]:
        self._records = records
        return super().learn(records)

    def update(self, batch: UpdateBatch) -> dict[str, float]:
        """The PPO update of this rank's rows as part of the global batch."""
        assert self.optimizer is not None
        cfg = self.config
        kept = [self._records[i] for i in trainable_rows(self._records)]
        local = list(zip([self._order_key(r) for r in kept], batch.tree_B.tolist(), strict=True))
        ranks = dist.gather_objects(local, self.world)
        rows = sorted(
            (key, rank, b, tree)
            for rank, part in enumerate(ranks)
            for b, (key, tree) in enumerate(part)
        )
        tree_ids: dict[tuple[int, int], int] = {}
        tree_B, positions = [], [0] * len(local)
        for position, (_, rank, b, tree) in enumerate(rows):
            tree_B.append(tree_ids.setdefault((rank, tree), len(tree_ids)))
            if rank == self.world.rank:
                positions[b] = position
        world, sharded = self.world, self.sharded is not None
        shard = UpdateShard(
            positions=positions,
            tree_B=tree_B,
            # FSDP2 summed the gradients in its backward already (reduce-scatter)
            reduce_gradients=(lambda parameters: None)
            if sharded
            else (lambda parameters: dist.reduce_gradients(parameters, world)),
            gather=lambda value: dist.gather_objects(value, world),
            lockstep=sharded,
        )
        return ppo_update(
            self.policy,
            self.optimizer,
            batch,
            cfg.train,
            temperature=cfg.policy.temperature,
            reference=self.reference,
            seed=derive_seed(cfg.train.seed, "update", self.step),
            shard=shard,
        )

    def _combine(self, experience: StepExperience) -> StepExperience:
        """The global step on every rank: all ranks' episodes, records (in one process's
        order), advantages and counts, and the advantage metrics of the global batch."""
        batch = experience.batch
        mine = {
            "records": batch.records,
            "episodes": [dataclasses.replace(e, env=None) for e in batch.episodes],
            "sampled_tokens": batch.sampled_tokens,
            "context_tokens": batch.context_tokens,
            "seconds": (batch.seconds_sampling, batch.seconds_env),
            "tokens_computed": experience.extra.get("tokens_computed"),
            "learned": self.learned,
        }
        ranks = dist.gather_objects(mine, self.world)
        records = sorted((r for part in ranks for r in part["records"]), key=self._order_key)
        self.learned = {k: v for part in ranks for k, v in part["learned"].items()}
        computed = [part["tokens_computed"] for part in ranks]
        combined = RolloutBatch(
            records=records,
            episodes=[e for part in ranks for e in part["episodes"]],
            sampled_tokens=sum(part["sampled_tokens"] for part in ranks),
            context_tokens=sum(part["context_tokens"] for part in ranks),
            seconds_sampling=max(part["seconds"][0] for part in ranks),
            seconds_env=max(part["seconds"][1] for part in ranks),
        )
        extra = {
            **experience.extra,
            **token_metrics(records, None if None in computed else int(sum(computed))),
            "rollout_env_steps": float(len(records)),
        }
        keys = [(r.traj_id, r.turn) for r in records]
        learned = [self.learned[key] for key in keys if key in self.learned]
        stats = [dict(s) for s in experience.learn_stats]
        if learned and stats:
            table = TurnTable.from_records([r for r, _ in learned], source=f"step {self.step}")
            advantages = np.array([a for _, a in learned], dtype=np.float64)
            stats[0].update(advantage_metrics(table, advantages, self.config.credit.estimator))
        return StepExperience(combined, stats, extra)

    # ------------------------------------------------------- rank 0's jobs
    def _write_rollouts(self, records: list[TurnRecord]) -> None:
        if self.world.main:
            super()._write_rollouts(records)

    def evaluate(self) -> dict[str, float]:
        """Rank 0 evaluates (the other ranks wait at the next collective)."""
        return super().evaluate() if self.world.main else {}

    def close(self) -> None:
        """Stop rank 0's Ray workers (if any), then close as one process does."""
        try:
            close = getattr(self.pool, "close", None)
            if close is not None:
                close()
        finally:
            super().close()
