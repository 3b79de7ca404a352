"""The update's rows layout without padding: a forward's rows packed into few sequences.

``update = "rows"`` recomputes every row's whole context. Padded to the longest row
(:func:`turnrl.policy.logprobs.row_scores`), a forward of rows of unequal length
runs ``rows x longest`` positions, the padding included. Packed, the rows'
``context + response`` sequences are laid one after another in as few bins as fit:

* position ids restart at 0 with every sequence (each token sees the positions it
  would see in its own row; rotary embeddings depend on positions only),
* attention is kept within each sequence: a block-diagonal causal mask per bin.

A bin is the tree layout with nothing merged (:meth:`TreeLayout.packed`, a forest of
one chain per row), so its mask is :mod:`turnrl.policy.tree_layout`'s code, not a
second copy. The numbers equal the padded layout's up to float summation order
(tested within 1e-5 in float32, tests/test_packing.py).

Why bins as long as the forward's longest row, not one sequence of all its rows: a
dense 4D mask makes attention cost the square of a sequence's length, masked pairs
included (sdpa's and eager's kernels compute them). One sequence of a whole 2048-token
budget of short turns ran the calculator batch's update 2.4x slower than padding on
CPU (benchmarks/RESULTS.md); bins no longer than the longest row never cost more
attention than padding (``sum of bin length squared <= rows x longest squared``) and
leave only each bin's tail as padding. Bins are filled greedily in the rows' order
(:func:`token_budget_groups` with the longest row as the budget).

A forward's rows are chosen by a token budget, ``train.max_tokens_per_batch``, the
same knob that cuts the tree layout's forwards (:func:`token_budget_groups`).

Attention implementations that take no custom 4D mask (``flash_attention_2``, GPU
only) fall back to the padded layout: the same numbers, padding computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from turnrl.policy.logprobs import (
    LayoutLogprobs,
    chunked_scored_tokens,
    output_parts,
    response_mask,
    row_scores,
    scored_tokens,
)
from turnrl.policy.tree_layout import (
    MASKABLE_ATTENTION,
    TreeLayout,
    model_attention,
    model_mask,
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
) -> LayoutLogprobs:
    """Log-probs and entropies of each row's response tokens from ONE forward over the rows packed
    into bins (contract of ``HFPolicy.response_logprobs``; the caller checks the
    inputs), and the positions it ran (bins x longest bin; with padding on the fallback
    of a model whose attention takes no 4D mask)."""
    sizes = [len(c) + len(r) for c, r in zip(contexts, responses, strict=True)]
    if model_attention(model) not in MASKABLE_ATTENTION:
        return row_scores(
            model,
            contexts,
            responses,
            temperature=temperature,
            pad_token_id=pad_token_id,
            device=device,
            chunk_tokens=chunk_tokens,
        )
    mask_B_T, targets_B_T = response_mask(responses, device)
    if not sizes or mask_B_T.numel() == 0:
        return LayoutLogprobs(mask_B_T.clone(), mask_B_T, 0, mask_B_T.clone())
    bins = token_budget_groups(sizes, max(sizes))
    layouts = [
        TreeLayout.packed([contexts[b] for b in rows], [responses[b] for b in rows])
        for rows in bins
    ]
    length = max(layout.size for layout in layouts)
    ids_K_L = torch.full((len(bins), length), pad_token_id, dtype=torch.long)
    positions_K_L = torch.zeros((len(bins), length), dtype=torch.long)
    # padding attends to itself only (a row of the mask with no key would be NaN)
    allowed_K_L_L = torch.eye(length, dtype=torch.bool, device=device).repeat(len(bins), 1, 1)
    # (bin, predictor position) of every response token, and its (row, step)
    where: list[tuple[int, int, int, int]] = []
    for k, (rows, layout) in enumerate(zip(bins, layouts, strict=True)):
        ids_K_L[k, : layout.size] = torch.tensor(layout.ids)
        positions_K_L[k, : layout.size] = torch.tensor(layout.depth)
        allowed_K_L_L[k, : layout.size, : layout.size] = layout.ancestor_mask(device)
        for b, nodes in zip(rows, layout.nodes, strict=True):
            where.extend((k, layout.parent[n], b, t) for t, n in enumerate(nodes))
    bin_N, predictor_N, row_N, step_N = (
        torch.tensor(column, device=device) for column in zip(*where, strict=True)
    )
    inputs = {
        "input_ids": ids_K_L.to(device),
        "attention_mask": model_mask(allowed_K_L_L[:, None], model),
        "position_ids": positions_K_L.to(device),
        "use_cache": False,
    }
    targets_N = targets_B_T[row_N, step_N]
    if chunk_tokens > 0:
        decoder, head = output_parts(model)
        hidden_N_H = decoder(**inputs).last_hidden_state[bin_N, predictor_N]
        scores = chunked_scored_tokens(head, hidden_N_H, targets_N, temperature, chunk_tokens)
    else:
        # logits only at positions some bin predicts from (the union over bins)
        keep_P, slot_N = torch.unique(predictor_N, return_inverse=True)
        logits_K_P_V = model(**inputs, logits_to_keep=keep_P).logits
        scores = scored_tokens(logits_K_P_V[bin_N, slot_N], targets_N, temperature)
    return LayoutLogprobs.scattered(scores, mask_B_T, (row_N, step_N), len(bins) * length)
