"""``TrainablePolicy``: what the update, SFT and Iterative GRPO need from a learner.

The sampling side is ``turnrl.types.Policy`` (encode, sample, decode): every backend has
it, including samplers that hold no trainable weights (a vLLM engine). A learner has
the sampling side too, plus this: parameters for an optimiser, state dicts for
checkpoints and weight sync, log-probs of given tokens with grad (row, packed and tree
layouts), a frozen copy (the KL reference), saving, and train/eval mode.
``turnrl.policy.hf.HFPolicy`` is the one implementation; ``ppo_update``, SFT and
iterate are typed against this protocol, not against it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from turnrl.types import Message, Sample

if TYPE_CHECKING:
    import torch

    from turnrl.policy.logprobs import LayoutLogprobs

__all__ = ["TrainablePolicy"]


@runtime_checkable
class TrainablePolicy(Protocol):
    """A policy the trainer updates (see the module docstring)."""

    model: Any
    """The underlying module (train/eval mode, activation hooks, LoRA wrapping)."""
    tokenizer: Any
    eos_token_id: int
    pad_token_id: int
    max_context: int | None

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The trainable parameters (only the adapters of a LoRA model)."""
        ...

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The trainable state (only the adapters of a LoRA model)."""
        ...

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> Any: ...

    def clone_frozen(self) -> TrainablePolicy:
        """An independent copy with gradients off, in eval mode (a KL reference)."""
        ...

    def save(self, directory: str | Path) -> None: ...

    def encode_initial(self, messages: list[Message]) -> list[int]: ...

    def encode_observation(self, message: Message) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def sample(
        self,
        contexts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        seed: int | Sequence[int] | None = None,
    ) -> list[Sample]: ...

    def response_logprobs(
        self,
        contexts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logp_B_T, mask_B_T)`` of given responses, one row each, with grad."""
        ...

    def tree_logprobs(
        self,
        contexts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
    ) -> LayoutLogprobs:
        """The same log-probs, every distinct token prefix computed once."""
        ...

    def packed_logprobs(
        self,
        contexts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
    ) -> LayoutLogprobs:
        """The same log-probs, the rows packed into one sequence without padding."""
        ...
