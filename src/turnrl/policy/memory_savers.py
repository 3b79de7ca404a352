"""The learner's memory savers, switched on only while an update trains.

Two options (``train.gradient_checkpointing``, ``train.logprob_chunk_tokens``;
docs/memory.md), both exact: the same log-probs and gradients, paid for with
recomputation in the backward.

* Gradient checkpointing per decoder layer: transformers'
  ``activation_checkpointing_enable`` with non-reentrant ``torch.utils.checkpoint``
  (the reentrant form needs inputs that require grad, which a LoRA model's frozen
  embeddings do not give). A layer keeps only its input for the backward and runs
  its forward again there. It acts only in train mode (transformers checks
  ``module.training``), and :func:`memory_savers` switches it off again when the
  update ends, so sampling, evaluation and the no-grad recomputations never see it.
* Log-probs in chunks of tokens: ``HFPolicy.logprob_chunk_tokens``, read by both
  update layouts (:func:`turnrl.policy.logprobs.chunked_target_logprobs`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

__all__ = ["configured_memory_savers", "memory_savers"]


class MemorySettings(Protocol):
    """The fields :func:`configured_memory_savers` reads (``PPOConfig``'s)."""

    gradient_checkpointing: bool
    logprob_chunk_tokens: int


@contextmanager
def memory_savers(
    policy: Any, *, gradient_checkpointing: bool = False, logprob_chunk_tokens: int = 0
) -> Iterator[None]:
    """Within the block, ``policy`` (an ``HFPolicy``) recomputes each decoder layer's
    activations in the backward when ``gradient_checkpointing``, and scores response
    tokens ``logprob_chunk_tokens`` at a time when > 0; both are as before afterwards
    (also when the block raises)."""
    if logprob_chunk_tokens < 0:
        raise ValueError(f"logprob_chunk_tokens must be >= 0, got {logprob_chunk_tokens}")
    if not gradient_checkpointing and logprob_chunk_tokens == 0:
        yield  # nothing to switch (nor to ask of ``policy``)
        return
    model = policy.model
    switch = gradient_checkpointing and not model.is_activation_checkpointing
    chunk_before = policy.logprob_chunk_tokens
    if switch:
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
    policy.logprob_chunk_tokens = logprob_chunk_tokens
    try:
        yield
    finally:
        policy.logprob_chunk_tokens = chunk_before
        if switch:
            _checkpointing_off(model)


def configured_memory_savers(policy: Any, settings: MemorySettings | None) -> Any:
    """:func:`memory_savers` as ``settings`` (an update's ``PPOConfig``) ask; none
    without settings."""
    if settings is None:
        return memory_savers(policy)
    return memory_savers(
        policy,
        gradient_checkpointing=settings.gradient_checkpointing,
        logprob_chunk_tokens=settings.logprob_chunk_tokens,
    )


def _checkpointing_off(model: Any) -> None:
    """Undo ``activation_checkpointing_enable``, including the hook it puts on the input
    embeddings (transformers removes that one itself only for its own peft integration)."""
    model.activation_checkpointing_disable()
    model.disable_input_require_grads()
