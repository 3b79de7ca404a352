"""Token accounting for rollouts, and sampling through a prefix cache.

Three counts describe what a batch of trajectories cost (per training step,
summed over the trees of the step; a tree is all trajectories of one task):

* ``tokens_all``: the tokens of every trajectory, each counted in full
  (context of its last turn plus its last response): what independent
  sampling of the same trajectories would have to hold.
* ``tokens_unique``: the physical minimum, the number of distinct
  ``(task, token prefix)`` pairs, i.e. the size of the token trie of each tree:
  a prefix shared by several trajectories counts once.
* ``tokens_computed``: positions the model actually ran (``HFPolicy.tokens_computed``:
  prefills plus fed-back tokens, no padding).

:class:`PrefixReuse` wraps a policy so the runner's ``policy.sample`` calls go
through one :class:`~turnrl.policy.prefix_cache.PrefixCache` (when the policy
supports it) and counts the tokens computed meanwhile.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from typing import Any

from turnrl.policy.prefix_cache import PrefixCache
from turnrl.types import Policy, Sample, TurnRecord


def final_sequences(records: Iterable[TurnRecord]) -> dict[str, dict[str, list[int]]]:
    """Per task, per trajectory: the full token sequence (last turn's prompt + response)."""
    last: dict[str, TurnRecord] = {}
    for record in records:
        best = last.get(record.traj_id)
        if best is None or record.turn > best.turn:
            last[record.traj_id] = record
    trees: dict[str, dict[str, list[int]]] = {}
    for traj_id, record in last.items():
        sequence = [*(record.prompt_ids or ()), *(record.response_ids or ())]
        trees.setdefault(record.task_id, {})[traj_id] = sequence
    return trees


def trie_size(sequences: Iterable[Sequence[int]]) -> int:
    """Number of distinct non-empty prefixes of ``sequences`` (nodes of their token trie)."""
    root: dict[int, Any] = {}
    size = 0
    for sequence in sequences:
        node = root
        for token in sequence:
            child = node.get(token)
            if child is None:
                child = node[token] = {}
                size += 1
            node = child
    return size


def token_metrics(records: Sequence[TurnRecord], computed: int | None) -> dict[str, float]:
    """``tokens_all``, ``tokens_unique`` and (when known) ``tokens_computed`` and the
    ratios ``computed_over_unique`` and ``unique_over_all`` of one step's records."""
    trees = final_sequences(records)
    total = sum(len(s) for tree in trees.values() for s in tree.values())
    unique = sum(trie_size(tree.values()) for tree in trees.values())
    out = {"tokens_all": float(total), "tokens_unique": float(unique)}
    if unique:
        out["unique_over_all"] = unique / total
    if computed is not None:
        out["tokens_computed"] = float(computed)
        if unique:
            out["computed_over_unique"] = computed / unique
    return out


def supports_prefix_cache(policy: Any) -> bool:
    """Whether ``policy.sample`` accepts a ``prefix_cache`` keyword."""
    try:
        return "prefix_cache" in inspect.signature(policy.sample).parameters
    except (TypeError, ValueError):
        return False


class PrefixReuse:
    """A ``Policy`` that samples through one shared prefix cache and counts computed tokens.

    Everything but ``sample`` is delegated to the wrapped policy. With
    ``enabled=False`` (or a policy without prefix caching) it only counts.
    ``tokens_computed`` is ``None`` when the wrapped policy does not count.
    Call :meth:`clear` after every policy update: cached states belong to the
    parameters they were computed with.
    """

    def __init__(self, policy: Policy, *, enabled: bool = True) -> None:
        self.policy = policy
        self.cache = PrefixCache() if enabled and supports_prefix_cache(policy) else None
        self._start = getattr(policy, "tokens_computed", None)

    @property
    def eos_token_id(self) -> int:
        return self.policy.eos_token_id

    @property
    def max_context(self) -> int | None:
        return self.policy.max_context

    def encode_initial(self, messages: list[dict[str, str]]) -> list[int]:
        return self.policy.encode_initial(messages)

    def encode_observation(self, message: dict[str, str]) -> list[int]:
        return self.policy.encode_observation(message)

    def decode(self, ids: list[int]) -> str:
        return self.policy.decode(ids)

    def sample(
        self,
        contexts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[Sample]:
        if self.cache is None:
            return self.policy.sample(
                contexts, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed
            )
        return self.policy.sample(  # type: ignore[call-arg]
            contexts,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            prefix_cache=self.cache,
        )

    def clear(self) -> None:
        """Forget cached states (the policy's parameters changed)."""
        if self.cache is not None:
            self.cache.clear()

    @property
    def tokens_computed(self) -> int | None:
        """Tokens the wrapped policy computed since this wrapper was made."""
        now = getattr(self.policy, "tokens_computed", None)
        if now is None or self._start is None:
            return None
        return int(now - self._start)
