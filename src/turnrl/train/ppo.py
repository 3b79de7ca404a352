"""The PPO update every trainer shares: its config, the update batch, ``ppo_update``.

``turnrl train`` (environment rollouts), the agent loop (records from the gateway)
and Iterative GRPO's improvement step (candidates scored by Q) all end in the same
update: turn records with one advantage each -> :func:`build_update_batch` ->
:func:`ppo_update`, configured by one :class:`PPOConfig` section (``[train]`` and
``[improve]`` are PPO sections with their trainer's own fields added).

What the update gets right, and tests pin (tests/test_ppo.py):

* training log-probs are recomputed at the **sampling temperature**, so the first
  mini-batch's ratio to the behaviour log-probs is exactly 1;
* aggregation weights are computed once for the whole batch and each mini-batch's
  are scaled by the number of mini-batches, so the mean of the mini-batch gradients
  is the full-batch gradient, whatever the split;
* the A2TGPO clip factor (per row) scales both clip widths;
* with ``kl_coef > 0`` the frozen reference policy's log-probs (same temperature)
  enter the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from turnrl.policy import HFPolicy
from turnrl.table import TurnTable
from turnrl.train.config import PPOConfig
from turnrl.train.loss import aggregation_weights, ppo_clip_loss
from turnrl.types import TurnRecord

__all__ = ["PPOConfig", "UpdateBatch", "build_update_batch", "pad_rows", "ppo_update"]


def pad_rows(rows: list[list[float]], width: int, value: float = 0.0) -> torch.Tensor:
    """Right-pad float rows into a ``(len(rows), width)`` tensor."""
    out = torch.full((len(rows), width), value, dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


@dataclass
class UpdateBatch:
    """The trainable rows of one step (turns with at least one response token)."""

    contexts: list[list[int]]
    responses: list[list[int]]
    old_logp_B_T: torch.Tensor
    """Behaviour log-probs (at the sampling temperature), 0 at padding."""
    mask_B_T: torch.Tensor
    adv_B: torch.Tensor
    clip_factor_B: torch.Tensor | None
    """Per-row multiplier of both clip widths (A2TGPO), or None."""
    weight_B_T: torch.Tensor
    """Aggregation weights of the whole batch (they sum to 1)."""


def build_update_batch(
    records: list[TurnRecord],
    table: TurnTable,
    advantages: np.ndarray,
    clip_factor: np.ndarray | None,
    aggregation: str,
) -> UpdateBatch:
    """The padded update batch of the rows that are trained on.

    Rows without response tokens, and rows marked ``train = false`` (tree
    rollouts' copies of shared turns: they count in the credit table, for returns
    and trajectory structure, but are updated on once, through the original), are
    left out; ``advantages`` and ``clip_factor`` are per record, as ``table``.
    """
    keep = [i for i, r in enumerate(records) if r.response_ids and r.train]
    if not keep:
        raise ValueError("no record to update on (every row is train=false or has no response)")
    responses = [list(records[i].response_ids or ()) for i in keep]
    width = max(len(r) for r in responses)
    mask = pad_rows([[1.0] * len(r) for r in responses], width)
    rollout = torch.as_tensor(table.traj_code[keep])
    return UpdateBatch(
        contexts=[list(records[i].prompt_ids or ()) for i in keep],
        responses=responses,
        old_logp_B_T=pad_rows([list(records[i].logprobs or ()) for i in keep], width),
        mask_B_T=mask,
        adv_B=torch.as_tensor(advantages[keep], dtype=torch.float32),
        clip_factor_B=None
        if clip_factor is None
        else torch.as_tensor(clip_factor[keep], dtype=torch.float32),
        weight_B_T=aggregation_weights(mask, aggregation, rollout),
    )


def ppo_update(
    policy: HFPolicy,
    optimizer: torch.optim.Optimizer,
    batch: UpdateBatch,
    config: PPOConfig,
    *,
    temperature: float,
    reference: HFPolicy | None,
    seed: int,
) -> dict[str, float]:
    """``config.epochs`` passes of mini-batch PPO-clip steps over one batch of turns.

    ``temperature`` is the one the batch was sampled at (log-probs are recomputed at
    it); ``seed`` fixes the mini-batch order; ``reference`` (frozen) enables the KL
    penalty when ``config.kl_coef > 0``. ``config.max_grad_norm`` clips the gradient
    norm (0: no clipping; the norm is still reported). Returns the mean of each loss
    statistic over the optimiser steps.
    """
    n = len(batch.contexts)
    size = min(config.minibatch_size, n)
    n_minibatches = -(-n // size)
    generator = torch.Generator().manual_seed(seed)
    stats: list[dict[str, float]] = []
    parameters = [p for p in policy.parameters() if p.requires_grad]
    policy.model.train()
    for _ in range(config.epochs):
        order = torch.randperm(n, generator=generator).tolist()
        for start in range(0, n, size):
            rows = order[start : start + size]
            contexts = [batch.contexts[i] for i in rows]
            responses = [batch.responses[i] for i in rows]
            logp_B_T, mask_B_T = policy.response_logprobs(
                contexts, responses, temperature=temperature
            )
            width = logp_B_T.shape[1]
            ref = None
            if reference is not None:
                with torch.no_grad():
                    ref, _ = reference.response_logprobs(
                        contexts, responses, temperature=temperature
                    )
            loss, info = ppo_clip_loss(
                logp_B_T,
                batch.old_logp_B_T[rows, :width],
                batch.adv_B[rows],
                mask_B_T,
                batch.weight_B_T[rows, :width] * n_minibatches,
                clip_low=config.clip_low,
                clip_high=config.clip_high,
                clip_factor_B=None if batch.clip_factor_B is None else batch.clip_factor_B[rows],
                ref_logp_B_T=ref,
                kl_coef=config.kl_coef,
                kl_estimator=config.kl_estimator,
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm = _clip_grad_norm(parameters, config.max_grad_norm)
            optimizer.step()
            stats.append({**info, "loss": float(loss.item()), "grad_norm": norm})
    policy.model.eval()
    return {k: float(np.mean([s[k] for s in stats])) for k in stats[0]}


def _clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip the gradients' total norm to ``max_norm`` (0: leave them) and return the
    norm before clipping. (torch's ``clip_grad_norm_`` with 0 would zero them.)"""
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    norms = torch.stack([torch.linalg.vector_norm(g) for g in grads])
    return float(torch.linalg.vector_norm(norms))
