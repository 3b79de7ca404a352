"""Key/value states of token prefixes, kept so branching rollouts encode a shared prefix once.

Tree rollouts sample several responses from one context and continue several
branches that share their history. Without a cache, every ``sample`` call runs
the whole context through the model again. A :class:`PrefixCache` keeps the
attention keys and values computed during sampling, indexed by the token
sequence they encode, so a later call only computes the part of a context that
no earlier call saw (see ``HFPolicy.sample(..., prefix_cache=)``).

Storage is a token trie over :class:`Segment` chains. A segment holds the
keys/values of positions ``[start, end)`` and points to the segment holding the
positions before ``start``; every trie node along a stored sequence refers to a
segment chain that covers it. Shared prefixes are therefore stored once, and
memory grows with the number of distinct tokens, not with the sum of context
lengths.

Validity: keys/values depend on the parameters. ``bind(signature)`` clears the
cache whenever the signature (a fingerprint of the parameters, given by the
policy) changes, so a cache can never serve states of an older policy; callers
that update the policy should still ``clear()`` explicitly. Keys are cached
after the rotary embedding of their absolute position, which is why entries are
reused only at the same absolute positions (a prefix always starts at 0).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

LayerKV = tuple[torch.Tensor, torch.Tensor]
"""Keys and values of one attention layer, each ``[heads, positions, head_dim]``."""


@dataclass(frozen=True, eq=False)
class Segment:
    """Keys/values of positions ``[start, start + length)`` of one token sequence.

    ``parent`` covers the positions before ``start`` (``None`` when ``start == 0``).
    """

    parent: Segment | None
    start: int
    kv: tuple[LayerKV, ...]

    @property
    def end(self) -> int:
        return self.start + int(self.kv[0][0].shape[1])

    def gather(self, length: int) -> tuple[LayerKV, ...]:
        """Keys/values of positions ``[0, length)`` of this chain, per layer."""
        if not 0 < length <= self.end:
            raise ValueError(f"cannot gather {length} positions from a chain ending at {self.end}")
        pieces: list[tuple[LayerKV, ...]] = []
        upto: int = length
        segment: Segment | None = self
        while upto > 0:
            assert segment is not None and segment.start < upto, "broken segment chain"
            take = upto - segment.start
            pieces.append(tuple((k[:, :take], v[:, :take]) for k, v in segment.kv))
            upto = segment.start
            segment = segment.parent
        pieces.reverse()
        return tuple(
            (
                torch.cat([p[layer][0] for p in pieces], dim=1),
                torch.cat([p[layer][1] for p in pieces], dim=1),
            )
            for layer in range(len(self.kv))
        )


class _Node:
    __slots__ = ("children", "segment")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.segment: Segment | None = None


class PrefixCache:
    """Token trie of cached key/value segments (see the module docstring).

    Counters: ``stored_tokens`` (positions held), ``lookups``, ``reused_tokens``
    (positions served from the cache instead of being computed).
    """

    def __init__(self) -> None:
        self._root = _Node()
        self._signature: Hashable | None = None
        self.stored_tokens = 0
        self.lookups = 0
        self.reused_tokens = 0

    def clear(self) -> None:
        """Drop every cached state (call after the policy's parameters change)."""
        self._root = _Node()
        self.stored_tokens = 0

    def bind(self, signature: Hashable) -> None:
        """Clear the cache if it was filled under another parameter ``signature``."""
        if signature != self._signature:
            self.clear()
            self._signature = signature

    def lookup(self, ids: Sequence[int], limit: int) -> tuple[int, Segment | None]:
        """Longest cached prefix of ``ids[:limit]``: its length and a chain covering it."""
        self.lookups += 1
        node, depth = self._root, 0
        for token in ids[:limit]:
            child = node.children.get(token)
            if child is None:
                break
            node, depth = child, depth + 1
        if depth == 0:
            return 0, None
        self.reused_tokens += depth
        return depth, node.segment

    def covers(self, ids: Sequence[int]) -> bool:
        """Whether all of ``ids`` is already cached."""
        node = self._root
        for token in ids:
            child = node.children.get(token)
            if child is None:
                return False
            node = child
        return True

    def store(self, ids: Sequence[int], segment: Segment) -> None:
        """Record that ``segment``'s chain holds the states of ``ids`` (``len(ids) ==
        segment.end``). Nodes already covered keep their segment."""
        if len(ids) != segment.end:
            raise ValueError(f"{len(ids)} ids but the segment chain ends at {segment.end}")
        node = self._root
        for token in ids:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node()
                self.stored_tokens += 1
            if child.segment is None:
                child.segment = segment
            node = child
