"""The agent loop (``turnrl train`` with ``[agent]``) over the ranks torchrun started.

One gateway, many learners (docs/distributed.md). Rank 0 is the one-process agent
loop (:class:`~turnrl.train.agent.loop.AgentTrainer`): it binds the gateway, runs
every agent against it (agents only need its base URL), evaluates, and alone writes
the run directory (records, metrics, checkpoints, failures; the CLI adds the report).
The other ranks run no gateway and no agent: they hold the same weights and wait for
their share of each update.

One step: rank 0 collects the step's rollouts and credits them exactly as one process
does, builds the update batch, and spreads the update over the ranks by task tree
(:mod:`turnrl.train.rank_zero`, which also says what the other ranks are told). The
weights stay identical on every rank, so rank 0's gateway serves the new policy after
the step with nothing to send (a vLLM sampler on rank 0 gets them by
:func:`turnrl.policy.sync.push_weights`, as in one process).

What the agents sample does not depend on the number of ranks (rank 0 samples all of
it, as one process), except through timing when ``agent.concurrency > 1`` (the gateway
batches whatever calls arrive together; the one-process loop has the same property)
and unseeded calls (each draws a fresh random seed, in one process too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from turnrl.train import distributed as dist
from turnrl.train.agent.loop import AgentTrainer
from turnrl.train.config import RunConfig
from turnrl.train.rank_zero import Leader, follow
from turnrl.train.run import Checkpoint, build_policy, derive_seed, initial_policy
from turnrl.train.update.ppo import UpdateBatch
from turnrl.train.validate import validate


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
        self.leader = Leader(world)
        dist.all_agree(
            lambda: AgentTrainer.__init__(
                self, config, resume=resume, overwrite=overwrite, quiet=quiet
            ),
            world,
        )

    def setup(self, checkpoint: Checkpoint | None) -> int:
        """Rank 0's warm start or resume (any refusal stops every rank with its line),
        then every rank takes its state."""
        done = dist.on_main(lambda: AgentTrainer.setup(self, checkpoint), self.world)
        assert self.optimizer is not None and done is not None
        dist.share_start_state(self.world, _models(self), self.optimizer, None)
        self.leader.started()
        return done

    def update(self, batch: UpdateBatch) -> dict[str, float]:
        """The step's update, its rows spread over the ranks by tree."""
        assert self.optimizer is not None
        cfg = self.config
        return self.leader.update(
            self.policy,
            self.optimizer,
            batch,
            cfg.train,
            temperature=cfg.policy.temperature,
            reference=self.reference,
            seed=derive_seed(cfg.train.seed, "update", self.step),
        )

    def run(self, *, stop_after: int | None = None) -> Path:
        return self.leader.lead(super().run, stop_after=stop_after)


class AgentUpdateRank:
    """A rank other than 0 of the agent loop under torchrun: it holds the policy, takes
    rank 0's starting state, and runs its share of every update until told to stop.
    It reads the config and ``warm_start.init_from``, and writes nothing."""

    def __init__(self, config: RunConfig, world: dist.World) -> None:
        assert not world.main
        self.config = config
        self.world = world
        dist.all_agree(self._build, world)

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
        follow(
            self.world,
            self.policy,
            self.optimizer,
            cfg.train,
            temperature=cfg.policy.temperature,
            reference=self.reference,
        )
        return Path(cfg.run_dir)


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
