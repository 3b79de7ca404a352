"""Log-probs of given response tokens after given contexts, one padded row per pair.

The per-row recomputation the update uses with ``train.update = "rows"`` and the
reference every faster path is tested against: every row's whole context is run
through the model, right-padded, positions ``0..len-1``. (The tree layout,
:mod:`turnrl.policy.tree_layout`, computes the same numbers running every
distinct prefix once.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from turnrl.policy.batching import pad_ids

TINY_TEMPERATURE = 1e-3
"""Below this temperature, :func:`tempered_log_softmax` divides max-shifted logits in
float64 (see there)."""


def tempered_log_softmax(logits_N_V: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` over the last axis, in float32, for every
    ``temperature > 0``.

    Tiny temperatures (any positive one is valid: a request's ``0 < t <= 2``, a
    config's ``policy.temperature > 0``) break the plain division in float32:
    ``1e-300`` becomes 0 there (``logits / 0`` is inf, then NaN), and ``1e-40``
    overflows every logit. Below :data:`TINY_TEMPERATURE` the logits are shifted so
    that their maximum is 0 (``log_softmax`` does not change) and divided in float64:
    the other logits go to large negative numbers (the lowest float32 at most, so that
    a padded position times its mask 0 stays 0), and the result is the exact limit of
    the distribution as the temperature goes to 0, the argmax with log-prob 0 (ties
    share the mass), instead of NaN. Sampling from it is greedy.
    """
    if temperature >= TINY_TEMPERATURE:
        return torch.log_softmax(logits_N_V.float() / temperature, dim=-1)
    shifted = logits_N_V.double() - logits_N_V.double().amax(-1, keepdim=True)
    logp_N_V = torch.log_softmax(shifted / temperature, dim=-1).float()
    return logp_N_V.clamp_min(torch.finfo(torch.float32).min)  # finite: 0 * it is 0


def target_logprobs(
    logits_N_V: torch.Tensor, targets_N: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Log-prob of each target under ``softmax(logits / temperature)``, in float32
    (:func:`tempered_log_softmax`: finite for every temperature > 0)."""
    logp_N_V = tempered_log_softmax(logits_N_V, temperature)
    return logp_N_V.gather(-1, targets_N[..., None]).squeeze(-1)


def check_pairs(
    contexts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], temperature: float
) -> None:
    """Clear errors for unpaired inputs and a non-positive temperature."""
    if len(contexts) != len(responses):
        raise ValueError(
            f"{len(contexts)} contexts but {len(responses)} responses; they must pair up"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def response_mask(
    responses: Sequence[Sequence[int]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mask_B_T`` (float32, 1 on real response tokens) and the right-padded targets
    ``targets_B_T`` (long, 0 at padding), ``T`` the longest response."""
    longest = max((len(r) for r in responses), default=0)
    lengths_B = torch.tensor([len(r) for r in responses], device=device)
    mask_B_T = (torch.arange(longest, device=device)[None, :] < lengths_B[:, None]).float()
    targets_B_T = torch.zeros((len(responses), longest), dtype=torch.long)
    for i, response in enumerate(responses):
        targets_B_T[i, : len(response)] = torch.tensor(list(response), dtype=torch.long)
    return mask_B_T, targets_B_T.to(device)


def row_logprobs(
    model: Any,
    contexts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    temperature: float,
    pad_token_id: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp_B_T, mask_B_T)`` of the responses, every row encoded on its own in one
    forward (see ``HFPolicy.response_logprobs`` for the contract)."""
    batch = len(contexts)
    longest = max((len(r) for r in responses), default=0)
    if batch == 0 or longest == 0:
        zeros = torch.zeros((batch, longest), device=device)
        return zeros, zeros.clone()
    seqs = [list(c) + list(r) for c, r in zip(contexts, responses, strict=True)]
    ids_B_L, mask_B_L = pad_ids(seqs, pad_token_id, left=False, device=device)
    length = ids_B_L.shape[1]
    # Only positions from the earliest response's predictor onwards need logits.
    start = min(len(c) for c in contexts) - 1
    out = model(
        input_ids=ids_B_L,
        attention_mask=mask_B_L,
        position_ids=torch.arange(length, device=device).expand(batch, length),
        use_cache=False,
        logits_to_keep=length - start,
    )
    logits_B_K_V = out.logits
    ctx_len_B = torch.tensor([len(c) for c in contexts], device=device)
    steps_T = torch.arange(longest, device=device)
    mask_B_T, targets_B_T = response_mask(responses, device)
    # Logit at absolute position p predicts token p + 1; kept index = p - start.
    index_B_T = (ctx_len_B[:, None] - 1 + steps_T[None, :] - start).clamp(
        max=logits_B_K_V.shape[1] - 1
    )
    picked_B_T_V = logits_B_K_V.gather(
        1, index_B_T[:, :, None].expand(-1, -1, logits_B_K_V.shape[-1])
    )
    logp_B_T = target_logprobs(picked_B_T_V, targets_B_T, temperature)
    return logp_B_T * mask_B_T, mask_B_T
