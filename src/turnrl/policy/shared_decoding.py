"""Sampling through a :class:`~turnrl.policy.prefix_cache.PrefixCache`.

:class:`SharedDecoder` draws exactly what :class:`~turnrl.policy.decoding.Decoder`
draws (same generators in the same order), but

* identical contexts in the batch are encoded once, and each context's longest
  cached prefix is taken from the cache instead of being recomputed;
* rows whose context and tokens so far are equal are one stream of the KV
  cache (one forward per step) until their draws differ, so identical samples
  cost one forward pass;
* the states of every distinct context and of every ``context + response[:-1]``
  are stored in the cache for later calls.

The cache is bound to a fingerprint of the parameters (torch's in-place version
counters), so it never serves states of older parameters. Not supported:
sliding-window attention models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from turnrl.policy.decoding import KV_CACHE, Decoder, Decoding, Prefill, draw
from turnrl.policy.prefix_cache import PrefixCache, Segment


def parameter_signature(model: Any) -> tuple[int, int]:
    """Changes whenever a parameter is modified in place (optimiser steps, loads)."""
    return id(model), sum(p._version for p in model.parameters())


@dataclass
class CachedPrefill(Prefill):
    """A prefill with one row per distinct context (``contexts_U``), and what decoding
    needs to share and store states: each context's row (``owner_B``), how much of it
    came from the cache and from which segment, and the width of the prefill layout
    (decode positions follow it)."""

    owner_B: list[int] = field(default_factory=list)
    cached_U: list[int] = field(default_factory=list)
    segments_U: list[Segment | None] = field(default_factory=list)
    width: int = 0
    contexts_U: list[list[int]] = field(default_factory=list)


def store_segment(
    prefix_cache: PrefixCache,
    cache: Any,
    row: int,
    sequence: list[int],
    parent: Segment | None,
    start: int,
    stop: int,
) -> Segment:
    """Store the states of ``sequence[start:]``, held by cache row ``row`` at positions
    ``[stop - (len(sequence) - start), stop)``, as a segment after ``parent``."""
    first = stop - (len(sequence) - start)
    kv = tuple(
        (layer.keys[row, :, first:stop].clone(), layer.values[row, :, first:stop].clone())
        for layer in cache.layers
    )
    segment = Segment(parent, start, kv)
    prefix_cache.store(sequence, segment)
    return segment


class SharedDecoder(Decoder):
    """The decoding loop with shared streams and a prefix cache (see the module docstring)."""

    def __init__(
        self,
        model: Any,
        stop_token_ids: frozenset[int],
        pad_token_id: int,
        prefix_cache: PrefixCache,
    ) -> None:
        super().__init__(model, stop_token_ids, pad_token_id)
        self.prefix_cache = prefix_cache

    def prefill(self, contexts: list[list[int]]) -> CachedPrefill:
        """Encode only what the cache lacks, once per distinct context (rows ``U``).

        Layout of unique row ``u`` (``P`` cached positions, ``S`` new ones, both
        padded to the batch maximum): ``[pad | cached P | pad | new S]``. The
        attention mask hides both pads and position ids are the absolute ones,
        so every row computes exactly what it would compute alone.
        """
        config = self.model.config
        if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
            raise ValueError("prefix_cache does not support sliding-window attention models")
        prefix_cache = self.prefix_cache
        prefix_cache.bind(parameter_signature(self.model))
        unique: dict[tuple[int, ...], int] = {}
        owner_B = [unique.setdefault(tuple(c), len(unique)) for c in contexts]
        rows = list(unique)
        found = [prefix_cache.lookup(row, limit=len(row) - 1) for row in rows]
        cached_U = [depth for depth, _ in found]
        new_U = [len(row) - depth for row, depth in zip(rows, cached_U, strict=True)]
        max_cached, max_new = max(cached_U), max(new_U)
        n_unique = len(rows)
        device = self.device
        ids_U_S = torch.full((n_unique, max_new), self.pad_token_id, dtype=torch.long)
        mask_U_L = torch.zeros((n_unique, max_cached + max_new), dtype=torch.long)
        position_U_S = torch.zeros((n_unique, max_new), dtype=torch.long)
        past: list[list[torch.Tensor]] | None = None
        for u, (row, (depth, segment)) in enumerate(zip(rows, found, strict=True)):
            new = len(row) - depth
            ids_U_S[u, max_new - new :] = torch.tensor(row[depth:], dtype=torch.long)
            mask_U_L[u, max_cached - depth : max_cached] = 1
            mask_U_L[u, max_cached + max_new - new :] = 1
            position_U_S[u, max_new - new :] = torch.arange(depth, len(row))
            if segment is None:
                continue
            layers = segment.gather(depth)
            if past is None:
                past = [
                    [k.new_zeros((n_unique, k.shape[0], max_cached, k.shape[2])) for k in kv]
                    for kv in layers
                ]
            for layer, (keys, values) in enumerate(layers):
                past[layer][0][u, :, max_cached - depth :] = keys
                past[layer][1][u, :, max_cached - depth :] = values
        cache = None if past is None else DynamicCache(ddp_cache_data=[tuple(kv) for kv in past])
        out = self.model(
            input_ids=ids_U_S.to(device),
            attention_mask=mask_U_L.to(device),
            position_ids=position_U_S.to(device),
            use_cache=True,
            **{KV_CACHE: cache},
            logits_to_keep=1,
        )
        self.computed += sum(new_U)
        return CachedPrefill(
            out.logits[:, -1, :],
            getattr(out, KV_CACHE),
            mask_U_L.to(device),
            torch.tensor([len(row) for row in rows], device=device),
            owner_B=owner_B,
            cached_U=cached_U,
            segments_U=[segment for _, segment in found],
            width=max_cached + max_new,
            contexts_U=[list(row) for row in rows],
        )

    def run(
        self,
        contexts: list[list[int]],
        budgets: list[int],
        temperature: float,
        generators: list[torch.Generator],
    ) -> Decoding:
        """Decode with shared streams: rows whose context and tokens so far are equal
        are one stream of the KV cache (one forward per step) until their draws differ.

        Each row still draws its own token from its stream's logits, with the same
        generators in the same order as :meth:`Decoder.run`, so the samples are the
        same. Finished rows leave their stream; the states of every distinct context
        and of every ``context + response[:-1]`` go into the prefix cache.
        """
        prefill = self.prefill(contexts)
        width = prefill.width
        cache = prefill.cache
        context_segment = [
            store_segment(
                self.prefix_cache,
                cache,
                u,
                rows_u,
                prefill.segments_U[u],
                prefill.cached_U[u],
                width,
            )
            for u, rows_u in enumerate(prefill.contexts_U)
        ]
        logits_S_V, mask_S_L, next_pos_S = prefill.logits_B_V, prefill.mask_B_L, prefill.next_pos_B
        stream_B = list(prefill.owner_B)
        state = Decoding.empty(len(contexts))
        for _ in range(max(budgets)):
            index_B = torch.tensor(stream_B, device=logits_S_V.device)
            token_B, logp_B = draw(logits_S_V[index_B], temperature, generators)
            for i in state.record((token_B, logp_B), budgets, self.stop_token_ids):
                sequence = [*contexts[i], *state.ids[i][:-1]]
                if len(state.ids[i]) > 1 and not self.prefix_cache.covers(sequence):
                    store_segment(
                        self.prefix_cache,
                        cache,
                        stream_B[i],
                        sequence,
                        context_segment[prefill.owner_B[i]],
                        len(contexts[i]),
                        width + len(state.ids[i]) - 1,
                    )
            live = [i for i, why in enumerate(state.reasons) if why is None]
            if not live:
                break
            streams: dict[tuple[int, int], int] = {}
            parents: list[int] = []
            tokens: list[int] = []
            drawn = token_B.tolist()
            for i in live:
                key = (stream_B[i], drawn[i])
                if key not in streams:
                    streams[key] = len(parents)
                    parents.append(stream_B[i])
                    tokens.append(drawn[i])
                stream_B[i] = streams[key]
            for i, why in enumerate(state.reasons):
                if why is not None:
                    stream_B[i] = 0  # finished: its draws are ignored
            if parents != list(range(len(parents))) or len(parents) != logits_S_V.shape[0]:
                order = torch.tensor(parents, device=logits_S_V.device)
                cache.reorder_cache(order)
                mask_S_L, next_pos_S = mask_S_L[order], next_pos_S[order]
            tokens_S = torch.tensor(tokens, device=logits_S_V.device)
            logits_S_V, cache, mask_S_L = self.step(tokens_S, mask_S_L, next_pos_S, cache)
            next_pos_S = next_pos_S + 1
            self.computed += len(parents)
        return state
