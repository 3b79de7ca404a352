"""The update Agent Lightning v0.x + verl makes of one step's turns, as loss weights.

Modelled on agentlightning 0.3.0 (``agentlightning/verl/trainer.py`` and
``daemon.py``, the v0.x line of issue #489, which runs on verl 0.5/0.6) and
verl's ``DataParallelPPOActor.update_policy`` and ``fsdp_workers`` of that era:

1. Every LLM call is one row; its reward is the rollout's final reward and its
   ``uid`` the task (``data_id``): turnrl's ``grpo_mixed``, with verl's rule for
   a uid holding one row (raw score, ``lone="raw"``). Advantages are computed on
   ALL rows.
2. Then rows whose prompt is longer than ``max_prompt_length`` are dropped
   (``is_drop_mask``), the rest are shuffled (``random.shuffle``) and cut to a
   multiple of ``ppo_mini_batch_size`` (the config value, in rows).
3. The actor splits what is left, in order, into mini-batches of
   ``ppo_mini_batch_size * rollout.n`` rows (verl's worker multiplies the config
   value by ``n``; one GPU here) and each mini-batch into micro-batches of
   ``ppo_micro_batch_size_per_gpu`` rows. Each micro-batch's loss is the token
   mean over ITS tokens (``loss_agg_mode = "token-mean"``), divided by
   ``gradient_accumulation = mini-batch rows // micro-batch rows``; the
   gradients of a mini-batch are summed and one optimiser step is taken. A last,
   shorter mini-batch is still divided by the full accumulation count.

:func:`legacy_weights` turns (2) and (3) into per-token weights for turnrl's
loss (``turnrl.train.update.loss``): a token of micro-batch ``m`` in mini-batch ``s``
weighs ``1 / (tokens(m) * accumulation * n_steps)``, i.e. the mean over the
optimiser steps of each step's loss, the same scale as turnrl's aggregation
weights (which sum to 1 per step). Simplified: verl computes the GRPO scores in
bfloat16 (``daemon.py`` builds them with ``dtype=torch.bfloat16``), here in
float64; ``balance_batch`` reorders rows across data-parallel ranks, a no-op with
one rank; response truncation at ``max_response_length`` is the environment's
``truncation = "zero_reward"``; PPO clipping and Adam are outside a first-order
projection.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LegacyPipeline:
    """The knobs of the Agent Lightning v0.x + verl update (names as in their configs)."""

    ppo_mini_batch_size: int
    """Config value: the drop rounds to a multiple of it (rows); the actor's mini-batch is
    this times ``rollout_n`` rows."""
    rollout_n: int
    """Rollouts per task (``actor_rollout_ref.rollout.n``)."""
    micro_batch_size: int = 4
    """``ppo_micro_batch_size_per_gpu`` (rows)."""
    max_prompt_length: int | None = None
    """Rows with a longer prompt (tokens) are dropped after the advantages; None keeps all."""

    @property
    def actor_mini_batch(self) -> int:
        return self.ppo_mini_batch_size * self.rollout_n

    @property
    def accumulation(self) -> int:
        return self.actor_mini_batch // self.micro_batch_size


@dataclass(frozen=True)
class LegacySelection:
    """Which rows one step trains on, in the order the actor sees them."""

    rows: list[int]
    """Indices into the step's rows (trained order)."""
    dropped_long: int
    """Rows dropped for a prompt longer than ``max_prompt_length``."""
    dropped_remainder: int
    """Rows dropped to reach a multiple of ``ppo_mini_batch_size``."""


def select_rows(
    prompt_lengths: Sequence[int], pipeline: LegacyPipeline, rng: random.Random
) -> LegacySelection:
    """Step 2: drop long prompts, shuffle, cut to a multiple of the mini-batch size."""
    limit = pipeline.max_prompt_length
    kept = [i for i, n in enumerate(prompt_lengths) if limit is None or n <= limit]
    rng.shuffle(kept)
    size = pipeline.ppo_mini_batch_size
    remain = len(kept) // size * size
    return LegacySelection(kept[:remain], len(prompt_lengths) - len(kept), len(kept) - remain)


def legacy_weights(mask_B_T: torch.Tensor, pipeline: LegacyPipeline) -> torch.Tensor:
    """Step 3 as per-token weights for rows already in trained order (see module docstring).

    Rows without tokens give their micro-batch nothing; a micro-batch without tokens
    contributes 0 (verl would divide 0 by 0 there; it does not happen with real rows).
    """
    n_rows = mask_B_T.shape[0]
    if n_rows == 0:
        return torch.zeros_like(mask_B_T, dtype=torch.float32)
    mask = mask_B_T.to(torch.float64)
    n_steps = -(-n_rows // pipeline.actor_mini_batch)
    weights = torch.zeros_like(mask)
    micro = pipeline.micro_batch_size
    for step_start in range(0, n_rows, pipeline.actor_mini_batch):
        step_end = min(step_start + pipeline.actor_mini_batch, n_rows)
        for start in range(step_start, step_end, micro):
            end = min(start + micro, step_end)
            tokens = float(mask[start:end].sum())
            if tokens > 0:
                scale = 1.0 / (tokens * pipeline.accumulation * n_steps)
                weights[start:end] = mask[start:end] * scale
    return weights.to(torch.float32)
