"""The learner's memory savers, switched on only while an update trains.

Two exact options (``train.gradient_checkpointing``, ``train.logprob_chunk_tokens``;
docs/memory.md): the same log-probs and gradients, paid for with recomputation in the
backward. One inexact one (``train.precision = "bf16-mixed"``): the training forwards
run under ``torch.autocast`` in bfloat16 while the weights (the master copy) and the
optimiser state stay float32; log-probs are taken in float32 from the bfloat16 logits.

* Gradient checkpointing per decoder layer: transformers'
  ``activation_checkpointing_enable`` with non-reentrant ``torch.utils.checkpoint``
  (the reentrant form needs inputs that require grad, which a LoRA model's frozen
  embeddings do not give). A layer keeps only its input for the backward and runs
  its forward again there. It acts only in train mode (transformers checks
  ``module.training``), and :func:`memory_savers` switches it off again when the
  update ends, so sampling, evaluation and the no-grad recomputations never see it.
* Log-probs in chunks of tokens: ``HFPolicy.logprob_chunk_tokens``, read by both
  update layouts (:func:`turnrl.policy.logprobs.chunked_scored_tokens`).
* Mixed precision: ``HFPolicy.autocast_dtype``; both layouts run their forward under
  ``torch.autocast(device type of the policy, that dtype)`` and the backward outside
  it (as torch recommends; checkpointed recomputations restore the forward's autocast
  state). :func:`turnrl.policy.logprobs.tempered_log_softmax` switches autocast off
  and upcasts the logits first, so the loss and the PPO ratios see float32 log-probs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch

__all__ = ["PRECISIONS", "configured_memory_savers", "memory_savers"]

PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16-mixed": torch.bfloat16}
"""``train.precision`` names and the dtype the training forwards autocast to (None: off)."""


class MemorySettings(Protocol):
    """The fields :func:`configured_memory_savers` reads (``PPOConfig``'s)."""

    gradient_checkpointing: bool
    logprob_chunk_tokens: int
    precision: str


@contextmanager
def memory_savers(
    policy: Any,
    *,
    gradient_checkpointing: bool = False,
    logprob_chunk_tokens: int = 0,
    precision: str = "fp32",
) -> Iterator[None]:
    """Within the block, ``policy`` (an ``HFPolicy``) recomputes each decoder layer's
    activations in the backward when ``gradient_checkpointing``, scores response
    tokens ``logprob_chunk_tokens`` at a time when > 0, and runs its training forwards
    under bfloat16 autocast with ``precision = "bf16-mixed"`` (its float32 weights
    untouched: they are the master copy); all are as before afterwards (also when the
    block raises)."""
    if logprob_chunk_tokens < 0:
        raise ValueError(f"logprob_chunk_tokens must be >= 0, got {logprob_chunk_tokens}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    autocast_dtype = PRECISIONS[precision]
    if not gradient_checkpointing and logprob_chunk_tokens == 0 and autocast_dtype is None:
        yield  # nothing to switch (nor to ask of ``policy``)
        return
    if autocast_dtype is not None and policy.dtype != torch.float32:
        raise ValueError(
            f"precision {precision!r} keeps float32 master weights; this policy's weights "
            f"are {policy.dtype} (load it in float32)"
        )
    model = policy.model
    switch = gradient_checkpointing and not model.is_activation_checkpointing
    chunk_before, autocast_before = policy.logprob_chunk_tokens, policy.autocast_dtype
    if switch:
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
    policy.logprob_chunk_tokens = logprob_chunk_tokens
    policy.autocast_dtype = autocast_dtype
    try:
        yield
    finally:
        policy.logprob_chunk_tokens = chunk_before
        policy.autocast_dtype = autocast_before
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
        precision=settings.precision,
    )


def _checkpointing_off(model: Any) -> None:
    """Undo ``activation_checkpointing_enable``, including the hook it puts on the input
    embeddings (transformers removes that one itself only for its own peft integration)."""
    model.activation_checkpointing_disable()
    model.disable_input_require_grads()
