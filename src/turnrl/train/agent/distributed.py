"""The agent loop (``turnrl train`` with ``[agent]``) over the ranks torchrun started.

One gateway, many learners (docs/distributed.md). Rank 0 is the one-process agent
loop (:class:`~turnrl.train.agent.loop.AgentTrainer`): it binds the gateway, runs
every agent against it (agents only need its base URL), evaluates, and alone writes
the run directory (records, metrics, checkpoints, failures; the CLI adds the report).
The other ranks run no gateway and no agent: they hold the same weights and wait for
their share of each update.

One step: rank 0 collects the step's rollouts and credits them exactly as one process
does, builds the global update batch (the aggregation weights are the whole batch's),
then spreads its rows over the ranks by task tree (:func:`spread_trees`: a task's
group never straddles ranks) and scatters the shares
(``torch.distributed.scatter_object_list``). Every rank runs the update of
:func:`turnrl.train.ppo.ppo_update` on its rows with an
:class:`~turnrl.train.ppo.UpdateShard`: the same mini-batch plan over the global
batch, gradients summed over ranks before the clip and the one optimiser step. The
weights stay identical on every rank, so rank 0's gateway serves the new policy after
the step with nothing to send (a vLLM sampler on rank 0 gets them by
:func:`turnrl.policy.sync.push_weights`, as in one process).

So N ranks compute the update one process computes on the same records, up to float
summation order. What the agents sample does not depend on N (rank 0 samples all of
it, as one process), except through timing when ``agent.concurrency > 1`` (the
gateway batches whatever calls arrive together; the one-process loop has the same
property).

Messages from rank 0, one per step and one at the end (``scatter_object_list``):
``("update", share)``, ``("stop",)`` or ``("error",)``: rank 0 stopped (too many
agent failures, any error) and prints why, and its exit status is the run's; the
other ranks end quietly with status 0 (:class:`~turnrl.train.distributed.StoppedByRankZero`),
so the user reads one line and torchrun names rank 0 as the cause.
Where the mismatch metrics (``train.log_mismatch``) are computed: on each rank's rows;
the metrics row shows rank 0's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from turnrl.train import distributed as dist
from turnrl.train.agent.loop import AgentTrainer
from turnrl.train.config import RunConfig
from turnrl.train.ppo import UpdateBatch, UpdateShard, ppo_update
from turnrl.train.run import build_policy, derive_seed, initial_policy
from turnrl.train.validate import validate


@dataclass(frozen=True)
class UpdateShare:
    """One rank's part of a step's update: its rows of the global batch, where they sit
    in it, every global row's tree, and the mini-batch seed (the same on every rank)."""

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
    reference: Any,
    config: RunConfig,
    world: dist.World,
) -> dict[str, float]:
    """This rank's part of the step's PPO update (every rank calls it with its share);
    the global batch's statistics."""
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
        config.train,
        temperature=config.policy.temperature,
        reference=reference,
        seed=share.seed,
        shard=shard,
    )


class DistributedAgentTrainer(AgentTrainer):
    """Rank 0 of the agent loop under torchrun: the one-process loop, whose updates are
    spread over ``world.size`` ranks."""

    SPLITS_OVER_RANKS = True

    def __init__(
        self,
        config: RunConfig,
        world: dist.World,
        *,
        resume: bool = False,
        overwrite: bool = False,
        quiet: bool = False,
    ) -> None:
        assert world.main, "rank 0 runs the gateway; the others are AgentUpdateRank"
        self.world = world
        self._listening = False
        """The other ranks wait for a message (set between the start and an update)."""
        dist.all_agree(
            lambda: AgentTrainer.__init__(
                self, config, resume=resume, overwrite=overwrite, quiet=quiet
            ),
            world,
        )

    def setup(self) -> None:
        dist.on_main(super().setup, self.world)
        assert self.optimizer is not None
        dist.share_start_state(self.world, _models(self), self.optimizer, None)
        self._listening = True

    def update(self, batch: UpdateBatch) -> dict[str, float]:
        """Scatter the step's rows by tree, update on rank 0's share with the others."""
        assert self.optimizer is not None
        seed = derive_seed(self.config.train.seed, "update", self.step)
        tree_B = batch.tree_B.tolist()
        shares = [
            ("update", UpdateShare(rows, positions, tree_B, seed))
            for rows, positions in spread_trees(batch, self.world.size)
        ]
        self._listening = False  # from here the ranks meet in the update's collectives
        own = dist.scatter_objects(shares, self.world)[1]
        stats = update_share(
            own, self.policy, self.optimizer, self.reference, self.config, self.world
        )
        self._listening = True
        return stats

    def run(self, *, stop_after: int | None = None) -> Path:
        try:
            run_dir = super().run(stop_after=stop_after)
        except dist.RankLost:
            raise  # a peer is gone: nobody is left to tell
        except BaseException:  # a TurnrlError (one line) or anything else (a traceback)
            self._tell(("error",))
            raise
        self._tell(("stop",))
        return run_dir

    def _tell(self, message: tuple[Any, ...]) -> None:
        """Send every other rank ``message`` if they are waiting for one."""
        if self._listening:
            self._listening = False
            dist.scatter_objects([message] * self.world.size, self.world)


class AgentUpdateRank:
    """A rank other than 0 of the agent loop under torchrun: it holds the policy, takes
    rank 0's starting state, and runs its share of every update until told to stop.
    It reads the config and ``warm_start.init_from``, and writes nothing."""

    def __init__(self, config: RunConfig, world: dist.World) -> None:
        assert not world.main
        self.config = config
        self.world = world
        dist.all_agree(lambda: self._build(), world)

    def _build(self) -> None:
        cfg = self.config
        validate(cfg)
        if cfg.train.threads > 0:
            torch.set_num_threads(cfg.train.threads)
        torch.manual_seed(cfg.train.seed)
        self.policy = build_policy(cfg.policy, cfg.train.seed)

    def run(self) -> Path:
        """Take the starting state, then update on each share rank 0 sends."""
        cfg = self.config
        dist.on_main(lambda: None, self.world)  # rank 0's warm start or resume
        self.policy = initial_policy(self.policy, cfg.warm_start, cfg.policy)
        self.reference = self.policy.clone_frozen() if cfg.train.kl_coef > 0 else None
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=cfg.train.lr, weight_decay=0.0
        )
        dist.share_start_state(self.world, _models(self), self.optimizer, None)
        self.policy.model.eval()
        while True:
            message = dist.scatter_objects(None, self.world)
            if message[0] == "stop":
                return Path(cfg.run_dir)
            if message[0] == "error":
                raise dist.StoppedByRankZero("rank 0 stopped the run")
            update_share(message[1], self.policy, self.optimizer, self.reference, cfg, self.world)


def _models(trainer: Any) -> list[torch.nn.Module]:
    """The modules whose weights rank 0 hands the others: the learner and the reference."""
    reference = [] if trainer.reference is None else [trainer.reference.model]
    return [trainer.policy.model, *reference]


def agent_rank(
    config: RunConfig,
    world: dist.World,
    *,
    resume: bool,
    overwrite: bool,
    quiet: bool,
) -> DistributedAgentTrainer | AgentUpdateRank:
    """This process's part of the agent loop: the gateway and the agents on rank 0, an
    update rank elsewhere."""
    if world.main:
        return DistributedAgentTrainer(
            config, world, resume=resume, overwrite=overwrite, quiet=quiet
        )
    return AgentUpdateRank(config, world)
