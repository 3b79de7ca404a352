"""The Agent Lightning v0.x + verl update as an aggregation mode: ``legacy-verl``.

Issue #489 asks whether the pipeline of Agent Lightning v0.x on verl 0.5/0.6 makes
agents stop calling tools. To train that pipeline (not only project it, as
``examples/grouping/legacy.py`` does), ``train.aggregation = "legacy-verl"`` gives
each token the weight that pipeline's update gives it; the advantages come from
the credit estimator as usual (the pipeline's are ``grpo_mixed`` with
``lone = "raw"``: every LLM call one row, grouped by task, verl's rule for a task
with one row). What the weights model, in the order the pipeline does it:

1. advantages are computed on all rows (the credit step, before this module);
2. rows whose prompt is longer than ``max_prompt_length`` tokens are dropped
   (weight 0), the rest shuffled and cut to a multiple of ``ppo_mini_batch_size``
   rows (the cut rows: weight 0);
3. the actor splits what is left, in order, into mini-batches of
   ``ppo_mini_batch_size * rollout_n`` rows and those into micro-batches of
   ``micro_batch_size`` rows; each micro-batch's loss is the token mean over ITS
   tokens divided by ``mini-batch rows // micro-batch rows`` (a last, shorter
   mini-batch is still divided by the full count).

A token of micro-batch ``m`` then weighs ``1 / (tokens(m) * accumulation *
n_steps)``: the mean over the pipeline's optimiser steps of each step's loss,
the scale of every other mode (the weights of full mini-batches sum to 1).

Departs from the pipeline: the pipeline takes one optimiser step per mini-batch;
here the weights enter turnrl's own update (``train.minibatch_size`` decides the
optimiser steps), so the first-order direction of a step is the pipeline's and
its number of steps is turnrl's. verl computes the GRPO scores in bfloat16, here
they are float64. Identical to ``examples/grouping/legacy.py`` (the projection
study's model; tests/test_legacy_pipeline.py checks the two agree).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from turnrl.train.config import TrainConfig

AGGREGATION = "legacy-verl"
"""The ``train.aggregation`` value that selects these weights."""


@dataclass(frozen=True)
class LegacyPipeline:
    """The knobs of the Agent Lightning v0.x + verl update (names as in their configs)."""

    ppo_mini_batch_size: int
    """Config value (rows): the drop rounds to a multiple of it; the actor's mini-batch is
    this times ``rollout_n`` rows."""
    rollout_n: int
    """Rollouts per task (``actor_rollout_ref.rollout.n``)."""
    micro_batch_size: int = 4
    """``ppo_micro_batch_size_per_gpu`` (rows)."""
    max_prompt_length: int | None = None
    """Rows with a longer prompt (tokens) are dropped after the advantages; None keeps all."""

    def __post_init__(self) -> None:
        for name in ("ppo_mini_batch_size", "rollout_n", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"legacy pipeline: {name} must be >= 1, got {getattr(self, name)}")

    @property
    def actor_mini_batch(self) -> int:
        return self.ppo_mini_batch_size * self.rollout_n

    @property
    def accumulation(self) -> int:
        return max(1, self.actor_mini_batch // self.micro_batch_size)


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


def micro_batch_weights(mask_B_T: torch.Tensor, pipeline: LegacyPipeline) -> torch.Tensor:
    """Step 3 as per-token weights for rows already in trained order (float32, (B, T)).

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


def legacy_aggregation_weights(
    mask_B_T: torch.Tensor,
    prompt_lengths: Sequence[int],
    pipeline: LegacyPipeline,
    seed: int,
) -> torch.Tensor:
    """Per-token weights of the whole batch in ITS row order (steps 2 and 3; dropped rows
    get 0). ``seed`` fixes the shuffle (the pipeline's ``random.shuffle``)."""
    if len(prompt_lengths) != mask_B_T.shape[0]:
        raise ValueError(
            f"{len(prompt_lengths)} prompt lengths for a batch of {mask_B_T.shape[0]} rows"
        )
    selection = select_rows(prompt_lengths, pipeline, random.Random(seed))
    weights = torch.zeros_like(mask_B_T, dtype=torch.float32)
    if selection.rows:
        index = torch.as_tensor(selection.rows)
        weights[index] = micro_batch_weights(mask_B_T[index], pipeline)
    return weights


def pipeline_of(train: TrainConfig, tasks_per_step: int, group_size: int) -> LegacyPipeline | None:
    """The pipeline a run's ``[train]`` declares (None unless its aggregation is
    ``legacy-verl``); ``legacy_mini_batch = 0`` means the step's tasks, ``rollout_n`` is
    the group size."""
    if train.aggregation != AGGREGATION:
        return None
    return LegacyPipeline(
        ppo_mini_batch_size=train.legacy_mini_batch or tasks_per_step,
        rollout_n=group_size,
        micro_batch_size=train.legacy_micro_batch,
        max_prompt_length=train.legacy_max_prompt_length or None,
    )
