"""Iterative GRPO (``turnrl iterate``) over the ranks torchrun started.

Rank 0 is the one-process loop (:class:`~turnrl.train.iterate.loop.IterativeGRPO`): it
deploys the policy (the environment's conversations), fits Q, samples the improvement
step's candidates and scores them, evaluates, and alone writes the run directory. What
is spread over the ranks is the improvement step's PPO updates
(:class:`turnrl.train.rank_zero.Leader`): each update batch's rows by task tree, the
gradients summed, one optimiser step on every rank. The other ranks hold the policy
and its optimiser and follow (:func:`turnrl.train.rank_zero.follow`); before each
improvement step rank 0 tells them to take the current weights as the KL reference.

So N ranks compute what one process computes, up to float summation order: what is
sampled is sampled on rank 0 with seeds derived from the config, as in one process.
Departures: the Q function is fitted on rank 0 alone (its own model and optimiser: it
is not spread), so the ranks speed up the policy update only; the deploy step and the
candidates' sampling cost what they cost in one process.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from turnrl.train import distributed as dist
from turnrl.train.iterate.config import IterateConfig
from turnrl.train.iterate.improve import trainable
from turnrl.train.iterate.loop import IterativeGRPO
from turnrl.train.iterate.qmodel import QFunction
from turnrl.train.rank_zero import Leader, follow
from turnrl.train.run import Checkpoint, build_policy, initial_policy
from turnrl.train.validate import validate
from turnrl.types import TurnRecord


class DistributedIterativeGRPO(IterativeGRPO):
    """Rank 0 of ``turnrl iterate`` under torchrun: the one-process loop whose
    improvement updates are spread over ``world.size`` ranks."""

    SPLITS_OVER_RANKS = True

    def __init__(
        self,
        config: IterateConfig,
        world: dist.World,
        *,
        from_logs: str | Path | None = None,
        quiet: bool = False,
        resume: bool = False,
        overwrite: bool = False,
    ) -> None:
        assert world.main, "rank 0 runs the loop; the others are IterateUpdateRank"
        self.world = world
        self.leader = Leader(world)
        dist.all_agree(
            lambda: IterativeGRPO.__init__(
                self, config, from_logs=from_logs, quiet=quiet, resume=resume, overwrite=overwrite
            ),
            world,
        )

    def setup(self, checkpoint: Checkpoint | None) -> int:
        """Rank 0's warm start or resume (any refusal stops every rank with its line),
        then the other ranks take its state."""
        done = dist.on_main(lambda: IterativeGRPO.setup(self, checkpoint), self.world)
        assert done is not None
        self._share()
        return done

    def _share(self) -> None:
        """Hand the other ranks the policy and its optimiser state; they then follow."""
        dist.share_start_state(self.world, [self.policy.model], self._optimizer(), None)
        self.leader.started()

    def improve(self, records: list[TurnRecord], q: QFunction, iteration: int) -> dict[str, float]:
        self.leader.tell("reference", self.config.improve.kl_coef > 0)
        return super().improve(records, q, iteration)

    def _ppo_update(self) -> Callable[..., dict[str, float]]:
        return self.leader.update

    def run(self, *, stop_after: int | None = None) -> Path:
        return self.leader.lead(super().run, stop_after=stop_after)


class IterateUpdateRank:
    """A rank other than 0 of ``turnrl iterate`` under torchrun: it holds the policy,
    takes rank 0's state and runs its share of every improvement update. It reads the
    config and ``warm_start.init_from``, and writes nothing."""

    def __init__(self, config: IterateConfig, world: dist.World) -> None:
        assert not world.main
        self.config = config
        self.world = world
        dist.all_agree(self._build, world)

    def _build(self) -> None:
        cfg = self.config
        validate(cfg)
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.policy = build_policy(cfg.policy, cfg.seed)

    def run(self) -> Path:
        """Take the starting state, then follow rank 0 to the end."""
        cfg = self.config
        dist.on_main(lambda: None, self.world)  # rank 0's warm start or resume
        policy = initial_policy(self.policy, cfg.warm_start, cfg.policy)
        optimizer = torch.optim.AdamW(trainable(policy), lr=cfg.improve.lr, weight_decay=0.0)
        dist.share_start_state(self.world, [policy.model], optimizer, None)
        policy.model.eval()
        follow(
            self.world,
            policy,
            optimizer,
            cfg.improve,
            temperature=cfg.improve.temperature,
            reference=None,
        )
        return Path(cfg.run_dir)


def iterate_rank(
    config: IterateConfig,
    world: dist.World,
    *,
    from_logs: str | Path | None,
    quiet: bool,
    resume: bool,
    overwrite: bool,
) -> DistributedIterativeGRPO | IterateUpdateRank:
    """This process's part of ``turnrl iterate``: the loop on rank 0, an update rank
    elsewhere."""
    if world.main:
        return DistributedIterativeGRPO(
            config, world, from_logs=from_logs, quiet=quiet, resume=resume, overwrite=overwrite
        )
    return IterateUpdateRank(config, world)
