"""The per-turn context cap of a run's rollouts (``rollout.max_context_tokens``).

Multi-turn contexts grow with every response and observation (tool results above
all), and a context that grows unchecked ends in an out-of-memory error in the sampler
or in the update (verl #3910 and #3945). The cap bounds every sampled turn: its
prompt plus its response budget (``policy.max_new_tokens``) must fit in
``max_context_tokens`` positions, exactly as they must fit in the model's own context.
A turn that would not fit is not sampled: the episode ends there, truncated
(``Episode.end == "context"``, what running out of the model's context already
records), its earlier turns are kept and trained on like any other episode's, and
the run counts it (:func:`truncation_metrics`: ``context_truncated`` in
``metrics.jsonl``).

How: :func:`cap_context` wraps the sampling policy so that its ``max_context`` is the
smaller of the cap and the model's context; the runner
(:func:`turnrl.rollout.runner.step_episodes`) already ends an episode without room
for a response, so every strategy (independent, the tree strategies) and every place
that runs episodes through that policy (torchrun ranks, evaluation) gets the cap
without a line of its own. Unset (0), nothing is wrapped: a run without the
cap is the run it was before, token for token.

The gateway's side (agent programs) is in :mod:`turnrl.serve.limits` (the call is
refused with a 400 ``context_length_exceeded`` and the rollout is marked truncated).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from turnrl.types import Policy

TRUNCATED_AT_CONTEXT = "context"
"""``Episode.end`` (and a gateway rollout's ``truncated``) of an episode that ended
because its next turn would not fit the context (the cap or the model's own)."""


def capped_context(model_context: int | None, cap: int | None) -> int | None:
    """The positions a turn may use: the smaller of the model's context and the cap
    (``None`` for either, or a cap of 0: that one does not bound)."""
    if not cap:
        return model_context
    return cap if model_context is None else min(cap, model_context)


class ContextCapped:
    """A sampling policy whose ``max_context`` is at most ``cap``; everything else is
    the wrapped policy's (attribute access is delegated, so ``sample``, its
    ``prefix_cache`` keyword, ``tokens_computed`` and ``load_state_dict`` are the
    wrapped policy's own)."""

    def __init__(self, policy: Policy, cap: int) -> None:
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ValueError(f"rollout.max_context_tokens must be a positive int, got {cap!r}")
        self.policy = policy
        self.cap = cap

    @property
    def max_context(self) -> int | None:
        return capped_context(self.policy.max_context, self.cap)

    def __getattr__(self, name: str) -> Any:
        if name in ("policy", "cap"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.policy, name)


def cap_context(policy: Any, cap: int | None) -> Any:
    """``policy`` with its context capped at ``cap`` tokens; ``policy`` itself when
    ``cap`` is 0 or ``None`` (the default: nothing changes)."""
    return ContextCapped(policy, cap) if cap else policy


def build_capped(factory: Callable[[], Policy], cap: int | None) -> Any:
    """``cap_context(factory(), cap)``: for code that builds its policy elsewhere (a Ray
    rollout worker gets ``functools.partial(build_capped, factory, cap)``)."""
    return cap_context(factory(), cap)


def truncation_metrics(truncated: Sequence[bool]) -> dict[str, float]:
    """``context_truncated`` (episodes or rollouts that ended at the context cap) and
    ``context_truncated_frac`` (their share) of one batch."""
    count = sum(bool(t) for t in truncated)
    return {
        "context_truncated": float(count),
        "context_truncated_frac": count / len(truncated) if truncated else 0.0,
    }


def no_turn_fits(cap: int, step: int) -> str:
    """The one line a run stops with when no episode of a step could take its first turn
    under the cap (a misconfigured cap: there is nothing to learn from)."""
    return (
        f"rollout.max_context_tokens: {cap} leaves no room for the first turn of any "
        f"episode of step {step} (its prompt plus policy.max_new_tokens); raise it "
        "(0: the model's context)"
    )
