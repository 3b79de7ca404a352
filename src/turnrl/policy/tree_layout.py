"""The update's tree layout: every distinct token prefix of a set of rows computed once.

A training row is one agent turn, ``(context, response)``. The rows of one step
share most of their tokens: the system prompt and question of a task's group,
every earlier turn of a trajectory (turn ``k``'s context holds turns ``0..k-1``),
the prefixes of tree rollouts and their copies. Recomputing each row on its own
(:mod:`turnrl.policy.logprobs`) runs all of them again; the per-row update of
``make demo`` computes about 7x the distinct tokens.

Layout. The rows' token sequences (``context + response``) are merged into one
token trie; its nodes, in depth-first order, are ONE sequence for the model:

* a node attends to its ancestors and itself only (a boolean ``[N, N]`` mask;
  in depth-first order the ancestors of node ``i`` are the nodes ``j <= i``
  whose subtree interval ``[j, end_j)`` contains ``i``);
* its position id is its depth, so it sees exactly the positions it would see
  in its own row (rotary embeddings depend on positions only);
* logits are computed only at nodes that predict a response token
  (``logits_to_keep`` as an index tensor), and a response token's log-prob is
  read from its parent node's logits. A node shared by several rows (identical
  samples, PATR copies, a turn that is also the prefix of the next turn's
  context) is one position, so its gradient is the sum of the rows' gradients,
  exactly as with separate rows.

The numbers equal per-row recomputation up to float summation order (masked
keys contribute exact zeros to attention): tested within 1e-5 for log-probs and
1e-4 (relative) for gradients.

Why an attention mask and not shared-prefix key/values kept in the autograd
graph: measured on ``make demo``'s rollouts and on FrozenLake 4x4
(``benchmarks/update.py``, numbers in benchmarks/RESULTS.md), one forward of
the whole trie under a mask is as fast or faster than a forward per trie level
reusing ancestors' key/values, on the tiny model and on SmolLM2: with the
mask, the wasted work is attention over masked pairs, which is cheap next to
the projections and the output layer at these lengths, while the key/value
route pays one forward per branching level, copies every ancestor's keys and
values per child and pads each level to its longest segment. Its cost grows
with the square of the layout's length, which :func:`split_rows` bounds
(``train.max_tokens_per_batch``).

Requirements: attention through ``sdpa`` or ``eager`` (the two implementations
that accept a custom 4D mask; ``flash_attention_2`` does not), and a model with
absolute-position-free attention beyond rotary embeddings (Llama, Qwen2,
SmolLM2; no sliding windows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from turnrl.policy.logprobs import (
    LayoutLogprobs,
    chunked_scored_tokens,
    output_parts,
    scored_tokens,
)

MASKABLE_ATTENTION = frozenset({"sdpa", "eager"})
"""Attention implementations that take a custom 4D mask as it is."""


@dataclass(frozen=True)
class TreeLayout:
    """The token trie of a set of rows, its nodes in depth-first order.

    ``ids``, ``depth`` and ``end`` have one entry per node (``N`` in all):
    its token, its depth (position id) and the end of its subtree interval
    (node ``j``'s descendants are ``j + 1 .. end[j] - 1``). ``parent[i]`` is -1
    for a root. ``nodes`` holds, per row, the nodes of its response tokens in
    order (a row's log-prob at step ``t`` is its node's token under the logits of
    that node's parent); ``last`` the node of each row's last token.
    """

    ids: list[int]
    depth: list[int]
    parent: list[int]
    end: list[int]
    nodes: list[list[int]]
    last: list[int]

    @property
    def size(self) -> int:
        """Number of distinct token prefixes, i.e. positions one forward computes."""
        return len(self.ids)

    @classmethod
    def build(
        cls, contexts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]
    ) -> TreeLayout:
        """Merge the rows' ``context + response`` sequences into one trie (children in
        first-seen order) and number its nodes depth-first."""
        children: list[dict[int, int]] = [{}]  # node 0 is a virtual root
        token: list[int] = [-1]
        ends: list[list[int]] = []
        lasts: list[int] = []
        for context, response in zip(contexts, responses, strict=True):
            if not context:
                raise ValueError("every row needs a non-empty context")
            node, path = 0, []
            for t in (*context, *response):
                child = children[node].get(t)
                if child is None:
                    child = children[node][t] = len(token)
                    children.append({})
                    token.append(t)
                node = child
                path.append(node)
            ends.append(path[len(path) - len(response) :] if response else [])
            lasts.append(node)
        order = [0] * len(token)
        ids: list[int] = []
        depth: list[int] = []
        parent: list[int] = []
        end: list[int] = []
        # Iterative depth-first walk; a negative entry closes a node's subtree interval.
        stack: list[tuple[int, int, int]] = [(c, 0, -1) for c in reversed(children[0].values())]
        while stack:
            node, level, up = stack.pop()
            if node < 0:
                end[~node] = len(ids)
                continue
            index = len(ids)
            order[node] = index
            ids.append(token[node])
            depth.append(level)
            parent.append(up)
            end.append(0)
            stack.append((~index, 0, 0))
            stack.extend((c, level + 1, index) for c in reversed(children[node].values()))
        nodes = [[order[n] for n in row] for row in ends]
        return cls(ids, depth, parent, end, nodes, [order[n] for n in lasts])

    @classmethod
    def packed(
        cls, contexts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]
    ) -> TreeLayout:
        """The rows' ``context + response`` sequences one after another, nothing merged:
        a forest of one chain per row (the padding-free rows layout,
        :mod:`turnrl.policy.packing`). Positions restart at 0 with each row, and
        :meth:`ancestor_mask` is then block-diagonal causal: a token sees its own row's
        earlier tokens only."""
        ids: list[int] = []
        parent: list[int] = []
        depth: list[int] = []
        end: list[int] = []
        nodes: list[list[int]] = []
        last: list[int] = []
        for context, response in zip(contexts, responses, strict=True):
            if not context:
                raise ValueError("every row needs a non-empty context")
            start, stop = len(ids), len(ids) + len(context) + len(response)
            ids.extend((*context, *response))
            depth.extend(range(stop - start))
            parent.extend((-1, *range(start, stop - 1)))
            end.extend([stop] * (stop - start))
            nodes.append(list(range(stop - len(response), stop)))
            last.append(stop - 1)
        return cls(ids, depth, parent, end, nodes, last)

    def ancestor_mask(self, device: torch.device) -> torch.Tensor:
        """``[N, N]`` bool: ``mask[i, j]`` iff node ``j`` is node ``i`` or an ancestor."""
        index_N = torch.arange(self.size, device=device)
        end_N = torch.tensor(self.end, device=device)
        return (index_N[None, :] <= index_N[:, None]) & (index_N[:, None] < end_N[None, :])


def model_attention(model: Any) -> str:
    """The model's attention implementation (transformers' ``_attn_implementation``)."""
    return str(getattr(model.config, "_attn_implementation", None) or "eager")


def _attention_mask(layout: TreeLayout, model: Any, device: torch.device) -> torch.Tensor:
    """The ancestor mask in the form the model's attention takes (``[1, 1, N, N]``)."""
    return model_mask(layout.ancestor_mask(device)[None, None], model)


def model_mask(allowed: torch.Tensor, model: Any) -> torch.Tensor:
    """A boolean 4D mask (True: may attend) in the form the model's attention takes:
    bool for ``sdpa``, additive (0 / most negative value) for ``eager``."""
    implementation = model_attention(model)
    if implementation not in MASKABLE_ATTENTION:
        raise ValueError(
            f"the tree layout needs sdpa or eager attention, the model uses "
            f"{implementation!r} (use train.update = 'rows', or load it with sdpa)"
        )
    if implementation == "sdpa":
        return allowed
    dtype = next(model.parameters()).dtype
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


def tree_logprobs(
    model: Any,
    contexts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    temperature: float,
    chunk_tokens: int = 0,
) -> LayoutLogprobs:
    """Log-probs and entropies of each row's response tokens, from ONE forward over the
    rows' trie.

    Same contract as ``HFPolicy.response_logprobs`` (rows in the given order, ``T``
    the longest response, padding 0); the caller checks the inputs. ``chunk_tokens > 0``
    scores the trie's response nodes that many at a time
    (:func:`turnrl.policy.logprobs.chunked_scored_tokens`).
    """
    device = next(model.parameters()).device
    batch = len(contexts)
    longest = max((len(r) for r in responses), default=0)
    if batch == 0 or longest == 0:
        zeros = torch.zeros((batch, longest), device=device)
        return LayoutLogprobs(zeros, zeros.clone(), 0, zeros.clone())
    layout = TreeLayout.build(contexts, responses)
    # Every node some row scores, once; its predictor is its parent.
    scored = sorted({n for row in layout.nodes for n in row})
    slot = {n: k for k, n in enumerate(scored)}
    predictors_K = torch.tensor([layout.parent[n] for n in scored], device=device)
    inputs = {
        "input_ids": torch.tensor([layout.ids], device=device),
        "attention_mask": _attention_mask(layout, model, device),
        "position_ids": torch.tensor([layout.depth], device=device),
        "use_cache": False,
    }
    targets_K = torch.tensor([layout.ids[n] for n in scored], device=device)
    if chunk_tokens > 0:
        decoder, head = output_parts(model)
        hidden_K_H = decoder(**inputs).last_hidden_state[0, predictors_K]
        scores = chunked_scored_tokens(head, hidden_K_H, targets_K, temperature, chunk_tokens)
    else:
        logits_K_V = model(**inputs, logits_to_keep=predictors_K).logits[0]
        scores = scored_tokens(logits_K_V, targets_K, temperature)
    index_B_T = torch.zeros((batch, longest), dtype=torch.long)
    mask_B_T = torch.zeros((batch, longest))
    for b, row in enumerate(layout.nodes):
        index_B_T[b, : len(row)] = torch.tensor([slot[n] for n in row], dtype=torch.long)
        mask_B_T[b, : len(row)] = 1.0
    mask_B_T = mask_B_T.to(device)
    index_B_T = index_B_T.to(device)
    return LayoutLogprobs(
        scores.logp[index_B_T] * mask_B_T,
        mask_B_T,
        layout.size,
        scores.entropy[index_B_T] * mask_B_T,
    )


def split_rows(
    contexts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    max_tokens: int,
) -> list[list[int]]:
    """Cut rows into groups whose tries hold at most ``max_tokens`` nodes each.

    Rows are taken in depth-first order of the trie of all of them, and a group
    is closed when the next row would push its trie over the budget, so groups
    are cut at subtree boundaries: the only tokens computed twice are the shared
    ancestors of two neighbouring groups. A single row longer than the budget is
    a group of its own (it cannot be cut). Returns row indices per group; every
    row is in exactly one group.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    layout = TreeLayout.build(contexts, responses)
    sequences = [(*c, *r) for c, r in zip(contexts, responses, strict=True)]
    ordered = sorted(range(len(sequences)), key=lambda b: (layout.last[b], b))
    groups: list[list[int]] = []
    size = 0
    previous: Sequence[int] = ()
    for b in ordered:
        sequence = sequences[b]
        new = len(sequence) - _common_prefix(previous, sequence)
        if groups and size + new <= max_tokens:
            groups[-1].append(b)
            size += new
        else:
            groups.append([b])
            size = len(sequence)
        previous = sequence
    return groups


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
