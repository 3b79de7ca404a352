"""One rank of ``turnrl train`` under torchrun: the trainer it runs, picked by the config.

Its own module so that the trainers it picks from import nothing back:
:class:`~turnrl.train.online.ranks.DistributedOnlineTrainer` (synchronous),
:class:`~turnrl.train.online.async_ranks.AsyncDistributedOnlineTrainer`
(``train.max_staleness >= 1``), or the agent loop's ranks
(:mod:`turnrl.train.agent.distributed`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from turnrl.rollout.strategies import RolloutPool
from turnrl.train import distributed as dist
from turnrl.train.config import RunConfig
from turnrl.train.lifecycle import Lifecycle
from turnrl.train.online.async_ranks import AsyncDistributedOnlineTrainer
from turnrl.train.online.ranks import DistributedOnlineTrainer

__all__ = ["rank_trainer", "train_distributed"]


def rank_trainer(config: Any, world: dist.World, **options: Any) -> DistributedOnlineTrainer:
    """One rank's environment trainer: asynchronous when ``train.max_staleness >= 1``,
    else the synchronous one (as before)."""
    if config.train.max_staleness >= 1:
        return AsyncDistributedOnlineTrainer(config, world, **options)
    return DistributedOnlineTrainer(config, world, **options)


def train_distributed(
    config: RunConfig,
    world: dist.World,
    *,
    resume: bool,
    overwrite: bool,
    quiet: bool,
    report: Callable[[Path], None] | None = None,
    pool_factory: Callable[[RunConfig], RolloutPool] | None = None,
) -> NoReturn:
    """One rank of ``turnrl train`` under torchrun: join the group, train (a built-in
    environment here, the agent loop with ``[agent]``), rank 0 calls
    ``report(run_dir)``; leave the group; end the process with the exit status
    (:func:`turnrl.train.distributed.run_as_rank`). With ``rollout.workers``, rank 0
    samples on the pool ``pool_factory(config)`` builds (Ray workers)."""
    quiet = quiet or not world.main

    def work() -> None:
        if config.agent.enabled:  # rank 0: the gateway and the agents; the others update
            from turnrl.train.agent.distributed import agent_rank

            trainer: Any = agent_rank(
                config, world, resume=resume, overwrite=overwrite, quiet=quiet
            )
            run_dir = trainer.run()
            if world.main and report is not None:
                report(run_dir)
            return
        online = rank_trainer(
            config,
            world,
            resume=resume,
            overwrite=overwrite,
            quiet=quiet,
            pool_factory=pool_factory,
        )
        Lifecycle(online, report=report if world.main else None).run()

    return dist.run_as_rank(world, config.policy.device, work, command="turnrl train")
