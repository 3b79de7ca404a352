"""Rank 0 samples, the ranks update: one process's update spread over torchrun ranks.

The agent loop (:mod:`turnrl.train.agent.distributed`) and Iterative GRPO
(:mod:`turnrl.train.iterate.distributed`) sample everything on rank 0, as one process
does (a gateway serving every agent; the improvement step's candidates), and spread
only the PPO update over the ranks. Rank 0 builds the update batch exactly as one
process (the aggregation weights are the whole batch's), splits its rows by task tree
(:func:`spread_trees`: a task's group never straddles ranks) and sends each rank its
share with ``torch.distributed.scatter_object_list``; every rank then runs
:func:`turnrl.train.update.ppo.ppo_update` on its rows with an
:class:`~turnrl.train.update.ppo.UpdateShard`: the same mini-batch plan over the global batch,
gradients summed over ranks before the clip and the one optimiser step. The weights
stay identical everywhere, so rank 0's sampler has the new policy after the step with
nothing to send. N ranks compute the update one process computes on the same batch,
up to float summation order.

:class:`Leader` is rank 0's side (:meth:`Leader.update` has ``ppo_update``'s
signature, so a trainer passes it where it would call ``ppo_update``); :func:`follow`
is every other rank's whole run after the start. Messages from rank 0, one at a time:

* ``("update", UpdateShare)``: run this share of an update;
* ``("reference", bool)``: take a frozen copy of the current weights as the KL
  reference (``True``), or none (Iterative GRPO, each improvement step);
* ``("stop",)``: the run is over;
* ``("error",)``: rank 0 stopped (any error) and prints why; its exit status is the
  run's, the others end quietly with status 0
  (:class:`~turnrl.train.distributed.StoppedByRankZero`), so the user reads one line
  and torchrun names rank 0 as the cause.

Where the mismatch metrics (``log_mismatch``) are computed: on each rank's rows,
gathered into the global batch's (:func:`turnrl.train.update.mismatch.mismatch_stats`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from turnrl.train import distributed as dist
from turnrl.train.update.ppo import PPOConfig, UpdateBatch, UpdateShard, ppo_update


@dataclass(frozen=True)
class UpdateShare:
    """One rank's part of an update: its rows of the global batch, where they sit in it,
    every global row's tree, and the mini-batch seed (the same on every rank)."""

    batch: UpdateBatch
    positions: list[int]
    tree_B: list[int]
    seed: int


def spread_trees(batch: UpdateBatch, ranks: int) -> list[tuple[UpdateBatch, list[int]]]:
    """``batch`` split over ``ranks`` by tree (task): rank ``r`` gets the ``r``-th of
    ``ranks`` contiguous runs of trees in order of first appearance (tree counts differ
    by at most one; a rank may get none when there are fewer trees than ranks). Each
    share is ``(rows of batch, their positions in batch)``, rows in batch order."""
    tree_B = batch.tree_B.tolist()
    trees = list(dict.fromkeys(tree_B))
    base, extra = divmod(len(trees), ranks)
    owner: dict[int, int] = {}
    start = 0
    for rank in range(ranks):
        stop = start + base + (rank < extra)
        owner.update((tree, rank) for tree in trees[start:stop])
        start = stop
    shares = []
    for rank in range(ranks):
        positions = [b for b, tree in enumerate(tree_B) if owner[tree] == rank]
        shares.append((rows_of(batch, positions), positions))
    return shares


def rows_of(batch: UpdateBatch, rows: list[int]) -> UpdateBatch:
    """The rows ``rows`` of ``batch`` (same width; weights unchanged, so still the global
    batch's)."""
    index = torch.tensor(rows, dtype=torch.long)
    return UpdateBatch(
        contexts=[batch.contexts[i] for i in rows],
        responses=[batch.responses[i] for i in rows],
        old_logp_B_T=batch.old_logp_B_T[index],
        mask_B_T=batch.mask_B_T[index],
        adv_B=batch.adv_B[index],
        clip_factor_B=None if batch.clip_factor_B is None else batch.clip_factor_B[index],
        weight_B_T=batch.weight_B_T[index],
        tree_B=batch.tree_B[index],
    )


def update_share(
    share: UpdateShare,
    policy: Any,
    optimizer: torch.optim.Optimizer,
    config: PPOConfig,
    *,
    temperature: float,
    reference: Any,
    world: dist.World,
) -> dict[str, float]:
    """This rank's part of an update (every rank calls it with its share); the global
    batch's statistics."""
    shard = UpdateShard(
        positions=share.positions,
        tree_B=share.tree_B,
        reduce_gradients=lambda parameters: dist.reduce_gradients(parameters, world),
        gather=lambda value: dist.gather_objects(value, world),
    )
    return ppo_update(
        policy,
        optimizer,
        share.batch,
        config,
        temperature=temperature,
        reference=reference,
        seed=share.seed,
        shard=shard,
    )


class Leader:
    """Rank 0's side: tells the other ranks what to do, and spreads each update."""

    def __init__(self, world: dist.World) -> None:
        assert world.main
        self.world = world
        self.listening = False
        """The other ranks wait for a message (from :meth:`started` on, except during an
        update, when the ranks meet in its collectives)."""

    def started(self) -> None:
        """The other ranks have the starting state and now wait for messages."""
        self.listening = True

    def tell(self, *message: Any) -> None:
        """Send every other rank ``message`` (when they wait for one)."""
        if self.listening:
            dist.scatter_objects([message] * self.world.size, self.world)

    def finish(self, *, failed: bool) -> None:
        """The run is over (``failed``: rank 0 stops with an error it reports)."""
        self.tell("error" if failed else "stop")
        self.listening = False

    def lead(self, run: Callable[..., Path], **options: Any) -> Path:
        """Rank 0's whole run (``run(**options)``), then tell the other ranks how it
        ended, so they stop with it; a lost peer leaves nobody to tell."""
        try:
            run_dir = run(**options)
        except dist.RankLost:
            raise
        except BaseException:  # a TurnrlError (one line) or anything else (a traceback)
            self.finish(failed=True)
            raise
        self.finish(failed=False)
        return run_dir

    def update(
        self,
        policy: Any,
        optimizer: torch.optim.Optimizer,
        batch: UpdateBatch,
        config: PPOConfig,
        *,
        temperature: float,
        reference: Any,
        seed: int,
    ) -> dict[str, float]:
        """``ppo_update`` of ``batch``, its rows spread over the ranks by tree."""
        tree_B = batch.tree_B.tolist()
        shares = [
            ("update", UpdateShare(rows, positions, tree_B, seed))
            for rows, positions in spread_trees(batch, self.world.size)
        ]
        self.listening = False  # a failure from here on leaves the ranks in a collective
        own = dist.scatter_objects(shares, self.world)[1]
        stats = update_share(
            own,
            policy,
            optimizer,
            config,
            temperature=temperature,
            reference=reference,
            world=self.world,
        )
        self.listening = True
        return stats


def follow(
    world: dist.World,
    policy: Any,
    optimizer: torch.optim.Optimizer,
    config: PPOConfig,
    *,
    temperature: float,
    reference: Any,
) -> None:
    """A rank other than 0 after the start: run the updates rank 0 sends until it says
    stop (returns) or reports an error (raises
    :class:`~turnrl.train.distributed.StoppedByRankZero`)."""
    while True:
        message = dist.scatter_objects(None, world)
        kind = message[0]
        if kind == "stop":
            return
        if kind == "error":
            raise dist.StoppedByRankZero("rank 0 stopped the run")
        if kind == "reference":
            reference = policy.clone_frozen() if message[1] else None
        elif kind == "update":
            update_share(
                message[1],
                policy,
                optimizer,
                config,
                temperature=temperature,
                reference=reference,
                world=world,
            )
        else:
            raise AssertionError(f"unknown message from rank 0: {kind!r}")
