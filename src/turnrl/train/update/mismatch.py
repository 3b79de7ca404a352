"""Train/inference mismatch: the learner's log-probs of sampled tokens against the sampler's.

The records' ``logprobs`` come from the sampler (transformers' forward in this process,
or a vLLM engine); the update recomputes them with the learner. With the same weights
they should agree: on the ``hf`` backend they are the same computation (the difference
is float rounding between batched layouts), on ``vllm`` they are different kernels and
the difference is real. :func:`learner_logprobs` recomputes every row once before the
update (no grad); :func:`mismatch_stats` summarises the difference per step:

* ``mismatch_logp_abs_mean`` / ``mismatch_logp_abs_max``: ``|learner - sampler|`` over
  response tokens;
* ``mismatch_kl``: the k3 estimate of KL(sampler || learner) per token
  (``r - 1 - log r`` with ``r = exp(learner - sampler)``, tokens drawn by the sampler);
* ``mismatch_seq_ratio_min`` / ``_max`` / ``_std``: the sequence-level importance ratio
  ``exp(sum_t (learner - sampler))`` of each row, its spread over the batch (1, 1, 0
  when the two agree).

The truncated importance weights built on the same numbers live in
:func:`turnrl.train.update.loss.truncated_is_weights`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from turnrl.policy.packing import token_budget_groups
from turnrl.policy.trainable import TrainablePolicy


class SampledRows(Protocol):
    """What :func:`learner_logprobs` reads of an update batch (``ppo.UpdateBatch`` has
    it; a Protocol keeps this module below ``ppo`` in the imports)."""

    contexts: Sequence[Any]
    responses: Sequence[Any]
    old_logp_B_T: torch.Tensor


__all__ = ["learner_logprobs", "mismatch_stats"]


@torch.no_grad()
def learner_logprobs(
    policy: TrainablePolicy,
    batch: SampledRows,
    *,
    temperature: float,
    max_tokens: int,
    forwards_of_busiest: Callable[[int], int] | None = None,
) -> torch.Tensor:
    """``logp_B_T`` of every row's response under ``policy`` now (float32, CPU, 0 at
    padding, the shape of ``batch.old_logp_B_T``), in forwards of rows holding at most
    ``max_tokens`` tokens (``train.max_tokens_per_batch``; a longer row alone), in batch
    order, each in the padded row layout (the layout whose numbers the others are tested
    against).

    ``forwards_of_busiest`` (an FSDP2-sharded learner, whose every forward is a
    collective of all ranks): given this rank's number of forwards, the most any rank
    runs; this rank then runs as many, the extra ones on its shortest row, their result
    unused. A rank without rows cannot pad (nor can the update's own padding,
    :func:`turnrl.train.update.ppo.padding_forward`): every rank holds a task group."""
    out_B_T = torch.zeros_like(batch.old_logp_B_T)
    was_training = policy.model.training
    policy.model.eval()
    sizes = [len(c) + len(r) for c, r in zip(batch.contexts, batch.responses, strict=True)]
    groups = token_budget_groups(sizes, max_tokens)
    padding = 0 if forwards_of_busiest is None else forwards_of_busiest(len(groups)) - len(groups)
    shortest = [min(range(len(sizes)), key=sizes.__getitem__)] if sizes else []
    try:
        for index, rows in enumerate([*groups, *[shortest] * padding]):
            logp_B_T, _ = policy.response_logprobs(
                [batch.contexts[b] for b in rows],
                [batch.responses[b] for b in rows],
                temperature=temperature,
            )
            if index < len(groups):  # a padding forward's result is not kept
                out_B_T[rows, : logp_B_T.shape[1]] = logp_B_T.float().cpu()
    finally:
        policy.model.train(was_training)
    return out_B_T


def mismatch_stats(
    learner_logp_B_T: torch.Tensor,
    sampler_logp_B_T: torch.Tensor,
    mask_B_T: torch.Tensor,
    gather: Callable[[Any], list[Any]] | None = None,
) -> dict[str, float]:
    """The ``mismatch_*`` metrics of one batch (see the module docstring). Under torchrun
    ``gather`` (every rank's value, in rank order) makes them the global batch's: each
    rank holds only its rows."""
    mask = mask_B_T.to(torch.bool)
    diff_B_T = torch.where(mask, learner_logp_B_T.double() - sampler_logp_B_T.double(), 0.0)
    tokens = diff_B_T[mask]
    seq_ratio_B = torch.exp(diff_B_T.sum(dim=1))[mask.any(dim=1)]
    if gather is not None:
        ranks = gather((tokens, seq_ratio_B))
        tokens = torch.cat([part for part, _ in ranks])
        seq_ratio_B = torch.cat([part for _, part in ranks])
    if tokens.numel() == 0:
        return {}
    kl = torch.exp(tokens) - 1.0 - tokens
    return {
        "mismatch_logp_abs_mean": float(tokens.abs().mean()),
        "mismatch_logp_abs_max": float(tokens.abs().max()),
        "mismatch_kl": float(kl.mean()),
        "mismatch_seq_ratio_min": float(seq_ratio_B.min()),
        "mismatch_seq_ratio_max": float(seq_ratio_B.max()),
        "mismatch_seq_ratio_std": float(seq_ratio_B.std(unbiased=False)),
    }
