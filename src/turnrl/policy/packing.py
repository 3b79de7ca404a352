"""The update's rows layout without padding: a forward's rows packed into one sequence.

``update = "rows"`` recomputes every row's whole context. Padded to the longest row
(:func:`turnrl.policy.logprobs.row_logprobs`), a forward of rows of unequal length
runs ``rows x longest`` positions, the padding included. Packed, it runs exactly the
rows' tokens: their ``context + response`` sequences one after another in ONE row,

* position ids restarting at 0 with every sequence (each token sees the positions it
  would see in its own row; rotary embeddings depend on positions only),
* attention kept within each sequence: a block-diagonal causal mask.

That is the tree layout with nothing merged (:meth:`TreeLayout.packed`, a forest of
one chain per row), so the mask, the scoring of response tokens and the chunked
log-probs are :mod:`turnrl.policy.tree_layout`'s code, not a second copy. The numbers
equal the padded layout's up to float summation order (tested within 1e-5 in float32,
tests/test_packing.py).

A forward's rows are chosen by a token budget, ``train.max_tokens_per_batch``, the
same knob that cuts the tree layout's forwards (:func:`token_budget_groups`).

Attention implementations that take no custom 4D mask (``flash_attention_2``, GPU
only) fall back to the padded layout: the same numbers, padding computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from turnrl.policy.logprobs import row_logprobs
from turnrl.policy.tree_layout import (
    MASKABLE_ATTENTION,
    TreeLogprobs,
    model_attention,
    tree_logprobs,
)

__all__ = ["packed_logprobs", "token_budget_groups"]


def token_budget_groups(sizes: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Cut items of the given token ``sizes`` into groups of at most ``max_tokens``
    tokens each, greedily in the given order: a group is closed when the next item
    would push it over the budget. An item larger than the budget is a group of its
    own (a row cannot be cut). Returns item indices per group, in order; every item is
    in exactly one group.

    In order, not sorted by size: the update's mini-batches are already shuffled by
    its seeded generator, so the groups are deterministic, and packing leaves no
    padding to save; sorting would only make fewer, fuller forwards at the price of
    always putting the longest rows together."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    groups: list[list[int]] = []
    total = 0
    for i, size in enumerate(sizes):
        if groups and total + size <= max_tokens:
            groups[-1].append(i)
            total += size
        else:
            groups.append([i])
            total = size
    return groups


def packed_logprobs(
    model: Any,
    contexts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    temperature: float,
    pad_token_id: int,
    device: torch.device,
    chunk_tokens: int = 0,
) -> TreeLogprobs:
    """Log-probs of each row's response tokens from ONE forward over the packed rows
    (contract of ``HFPolicy.response_logprobs``; the caller checks the inputs), and
    the positions it ran: the rows' tokens (with padding on the fallback of a model
    whose attention takes no 4D mask)."""
    if model_attention(model) in MASKABLE_ATTENTION:
        return tree_logprobs(
            model,
            contexts,
            responses,
            temperature=temperature,
            chunk_tokens=chunk_tokens,
            merge=False,
        )
    logp_B_T, mask_B_T = row_logprobs(
        model,
        contexts,
        responses,
        temperature=temperature,
        pad_token_id=pad_token_id,
        device=device,
        chunk_tokens=chunk_tokens,
    )
    longest = max((len(c) + len(r) for c, r in zip(contexts, responses, strict=True)), default=0)
    return TreeLogprobs(logp_B_T, mask_B_T, len(contexts) * longest)
