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

The model lives in the library since the trainer trains it too
(``train.aggregation = "legacy-verl"``): this module re-exports it under the names the
grouping scripts use.
"""

from __future__ import annotations

from turnrl.train.update.legacy_pipeline import (
    LegacyPipeline,
    LegacySelection,
    select_rows,
)
from turnrl.train.update.legacy_pipeline import micro_batch_weights as legacy_weights

__all__ = ["LegacyPipeline", "LegacySelection", "legacy_weights", "select_rows"]
