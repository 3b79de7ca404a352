"""What an RL run of ``turnrl train`` (the environment trainer and the agent loop)
starts from: the policy, its frozen KL reference and the optimiser, fresh or as a
checkpoint left them. Iterative GRPO builds its own (its optimiser is created on first
use, and its reference is each iteration's deployed policy)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from turnrl.train.run import Checkpoint, RunDirectory, initial_policy


@dataclass(frozen=True)
class TrainingStart:
    """What :func:`start_training` hands a trainer."""

    policy: Any
    reference: Any | None
    """Frozen warm start for the KL penalty (``None`` when ``train.kl_coef`` is 0)."""
    optimizer: Any


def start_training(
    run: RunDirectory,
    checkpoint: Checkpoint | None,
    policy: Any,
    config: Any,
    demonstrations: Callable[[], list[Any]],
    sampler: np.random.Generator,
) -> TrainingStart:
    """Start or resume an RL run from a ``RunConfig``-shaped ``config`` in ``run``
    (started: ``checkpoint`` is what :meth:`RunDirectory.start` returned).

    A fresh run warm-starts ``policy`` (:func:`~turnrl.train.run.initial_policy`, then
    :meth:`RunDirectory.warm_start` on ``demonstrations()``, batched as the update
    lays out its rows); a resumed one reloads the saved warm start and then the
    checkpoint's weights, optimiser state, ``sampler`` state and global RNGs. The
    frozen KL reference (the warm start, when ``train.kl_coef > 0``) and the AdamW
    optimiser are built the same way in both cases. The checkpoint's other ``extra``
    counters are the caller's to read.
    """
    import torch

    if checkpoint is None:
        policy = initial_policy(policy, config.warm_start, config.policy)
        policy = run.warm_start(
            policy,
            config.warm_start,
            demonstrations,
            seed=config.train.seed,
            update=config.train,
            progress=True,
        )
    else:
        policy = run.load_warm_start()
    reference = run.load_warm_start().clone_frozen() if config.train.kl_coef > 0 else None
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.train.lr, weight_decay=0.0)
    if checkpoint is not None:
        policy.load_state_dict(checkpoint.model)
        assert checkpoint.optimizer is not None  # RL checkpoints always carry one
        optimizer.load_state_dict(checkpoint.optimizer)
        sampler.bit_generator.state = checkpoint.extra["sampler"]
        checkpoint.restore_rng()  # after building models, which draw from it
    return TrainingStart(policy, reference, optimizer)
