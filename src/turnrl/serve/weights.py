"""The served policy: sampling through the micro-batcher, tokenising, weight swaps.

:class:`ServedPolicy` owns the policy lock. Sampling, tokenizer calls and weight
changes all take it (fast tokenizers are not safe to mutate from several
threads, and weights change only under it), so no request is sampled with half
updated weights. ``updating`` holds sampling while a trainer changes the weights
in place; ``swap_policy`` serves another policy object that tokenises the same.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from turnrl.serve.batcher import MicroBatcher, Sampled
from turnrl.serve.config import GatewayConfig
from turnrl.types import Message, Policy

T = TypeVar("T")

_PROBE: list[Message] = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "Compute 12*13."},
]


def check_version(version: Any) -> None:
    """A policy version: an integer >= 0 (bools refused)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"policy version must be an integer >= 0, got {version!r}")


class ServedPolicy:
    """The policy a gateway samples from, its version, and the lock that guards both."""

    def __init__(self, policy: Policy, config: GatewayConfig, version: int) -> None:
        self.lock = threading.RLock()
        """Held while sampling, tokenising and changing weights (re-entrant:
        ``load_weights`` runs inside ``updating``)."""
        self.batcher = MicroBatcher(
            policy,
            window_s=config.batch_window_s,
            max_batch=config.max_batch,
            lock=self.lock,
            version=version,
        )

    @property
    def policy(self) -> Policy:
        """The policy being served."""
        return self.batcher.policy

    @property
    def version(self) -> int:
        """Version of the weights being served (recorded on every turn)."""
        return self.batcher.version

    def sample(
        self, prompt_ids: list[int], *, max_new_tokens: int, temperature: float, seed: int | None
    ) -> Sampled:
        """One response, sampled in the next micro-batch (blocks until it is)."""
        return self.batcher.submit(
            prompt_ids, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed
        )

    def sample_choices(
        self,
        prompt_ids: list[int],
        *,
        seeds: Sequence[int | None],
        max_new_tokens: int,
        temperature: float,
    ) -> list[Sampled]:
        """One response per seed (``None``: unseeded), from one set of weights, sampled in
        the next micro-batch (blocks until they are)."""
        return self.batcher.submit_choices(
            prompt_ids, seeds=seeds, max_new_tokens=max_new_tokens, temperature=temperature
        )

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Call a tokenizer-side policy method under the policy lock."""
        with self.lock:
            return fn(*args)

    @contextmanager
    def updating(self, version: int) -> Iterator[Policy]:
        """Hold sampling while the caller changes the served policy in place.

        Waits for the batch being sampled, yields the policy, and serves
        ``version`` from then on (also if the block raises: the weights may have
        changed). Requests arriving meanwhile wait; none is sampled mid-update.
        """
        check_version(version)
        with self.lock:
            try:
                yield self.batcher.policy
            finally:
                self.batcher.version = version

    def load_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Load ``state_dict`` into the served policy between two batches."""
        policy = self.policy
        load = getattr(policy, "load_state_dict", None)
        if load is None:
            raise TypeError(f"{type(policy).__name__} has no load_state_dict; use swap_policy")
        with self.updating(version):
            load(state_dict)

    def swap_policy(self, policy: Policy, version: int) -> None:
        """Serve another policy object from the next batch on.

        It must tokenise like the current one (same end-of-turn id and the same
        ids for a probe conversation), because open rollouts keep token contexts.
        """
        check_version(version)
        with self.lock:
            old = self.batcher.policy
            same = policy.eos_token_id == old.eos_token_id and policy.encode_initial(
                _PROBE
            ) == old.encode_initial(_PROBE)
            if not same:
                raise ValueError(
                    "the new policy tokenises differently from the served one; open rollouts "
                    "keep token contexts, so it cannot be swapped in (start a new gateway)"
                )
            self.batcher.policy = policy
            self.batcher.version = version

    def batch_stats(self) -> dict[str, int]:
        """How requests were batched: ``calls``, ``requests``, ``largest``."""
        stats = self.batcher.stats
        return {"calls": stats.calls, "requests": stats.requests, "largest": stats.largest}

    def close(self) -> None:
        """Stop the sampling worker (requests after this fail)."""
        self.batcher.close()
