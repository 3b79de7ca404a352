"""``train.max_staleness = K >= 1`` under torchrun: every rank has a sampler process of
its own, which samples that rank's share of the next steps while the ranks update.

:class:`AsyncDistributedOnlineTrainer` is both parents at once: the update, the
start-state broadcast and the metrics of the whole batch are
:class:`~turnrl.train.online.ranks.DistributedOnlineTrainer`'s; where the episodes come
from is :class:`~turnrl.train.online.asynchronous.AsyncOnlineTrainer`'s. Each rank pushes
its (identical) weights to its own sampler after every update and requests the task
slots it owns (:func:`turnrl.train.distributed.owned_slice`), whole task groups, with
the episode seeds of the step's plan (``rollout.per_episode_seeds``, required under
torchrun). So N ranks at ``K`` sample exactly the episodes one process at ``K`` samples
with per-episode seeds, with the same versions of the weights: the schedule
(:mod:`turnrl.train.staleness`) is a function of the config, the same on every rank.

With ``train.sharding = "fsdp2"`` the learner is sharded over the ranks and each rank's
whole copy (:mod:`turnrl.train.fsdp`) is what its sampler process is pushed: every rank
gathers the shards into it after every update, at the same point (a collective), never
lazily at an evaluation, which rank 0 runs alone (:meth:`AsyncOnlineTrainer._push_weights`
pushes at once to a learner's own whole copy; :meth:`evaluate` pushes nothing on the
other ranks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from turnrl.rollout import RolloutBatch
from turnrl.rollout.runner import plan_episodes
from turnrl.train import distributed as dist
from turnrl.train.online.asynchronous import AsyncOnlineTrainer
from turnrl.train.online.ranks import DistributedOnlineTrainer
from turnrl.types import Task

__all__ = ["AsyncDistributedOnlineTrainer"]


class AsyncDistributedOnlineTrainer(AsyncOnlineTrainer, DistributedOnlineTrainer):
    """One rank of an asynchronous run (module docstring)."""

    def __init__(self, config: Any, world: dist.World, **options: Any) -> None:
        super().__init__(config, world=world, **options)

    def evaluate(self) -> dict[str, float]:
        """Rank 0 evaluates; the others neither evaluate nor push their own sampler for
        it (a push of a sharded learner is a gather all ranks must join)."""
        return super().evaluate() if self.world.main else {}

    def _owned_slots(self) -> tuple[int, int] | None:
        owned = dist.owned_slice(self.config.rollout.tasks_per_step, self.world)
        return owned.start, owned.stop

    def _runner(self, tasks: list[Task]) -> Callable[..., RolloutBatch]:
        """This rank's episodes from its sampler process; the plan's episode indices
        are kept, as the synchronous ranks keep them, to put the gathered batch in one
        process's order."""
        take = super()._runner(tasks)

        def run(policy: Any, make_env: Any, own_tasks: list[Task], **kwargs: Any) -> Any:
            plan = plan_episodes(tasks, kwargs["group_size"], kwargs.get("traj_prefix", ""))
            self._episode_index = {traj: k for k, (_, traj) in enumerate(plan)}
            return take(policy, make_env, own_tasks, **kwargs)

        return run
