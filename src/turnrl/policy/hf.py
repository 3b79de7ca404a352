"""``HFPolicy``: the ``Policy`` protocol on any transformers causal LM with a chat template.

This class only holds the model and its tokenizer and says which module does
what; each job lives in its own module:

* :mod:`turnrl.policy.chat`: chat-template token layout (initial contexts,
  observation deltas appended exactly, response decoding);
* :mod:`turnrl.policy.decoding`: the batched KV-cached sampling loop;
* :mod:`turnrl.policy.shared_decoding`: the same loop through a prefix cache
  (:mod:`turnrl.policy.prefix_cache`);
* :mod:`turnrl.policy.logprobs`: log-probs of given responses, one row each;
* :mod:`turnrl.policy.tree_layout`: the same log-probs, every distinct prefix
  of a batch computed once (the update's tree layout);
* :mod:`turnrl.policy.packing`: the same log-probs, rows packed without padding
  (the update's rows layout);
* :mod:`turnrl.policy.lora`: what differs with LoRA adapters;
* :mod:`turnrl.policy.memory_savers`: gradient checkpointing, chunked log-probs and
  bf16-mixed autocast while an update trains;
* :mod:`turnrl.policy.device`: device and precision names.

``Sample.logprobs`` are log-probs of the sampled tokens under the SAMPLING
distribution, ``softmax(logits / temperature)``; ``response_logprobs`` (and
``tree_logprobs``) with the same temperature recompute them, with grad, for the
PPO ratio.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from turnrl.policy import lora
from turnrl.policy.batching import check_lengths
from turnrl.policy.chat import ChatEncoding, ChatFormat, load_tokenizer
from turnrl.policy.decoding import Decoder, make_generators
from turnrl.policy.logprobs import LayoutLogprobs, check_pairs, row_scores
from turnrl.policy.packing import packed_logprobs
from turnrl.policy.prefix_cache import PrefixCache
from turnrl.policy.shared_decoding import SharedDecoder
from turnrl.policy.tree_layout import tree_logprobs
from turnrl.types import Sample

__all__ = ["HFPolicy", "load_tokenizer"]


@contextmanager
def transformers_progress_off() -> Iterator[None]:
    """Silence transformers' own progress bars ("Writing model shards", "Loading
    weights") while the block runs: a run shows turnrl's progress, not theirs in the
    middle of it. The previous setting is restored afterwards."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


class HFPolicy(ChatEncoding):
    """A chat policy backed by a transformers causal LM and its tokenizer.

    ``end_of_turn`` is the token that ends an assistant turn (default: the
    tokenizer's eos token). Sampling stops at it or at the tokenizer's eos token.
    """

    def __init__(self, model: Any, tokenizer: Any, *, end_of_turn: str | None = None) -> None:
        self.chat = ChatFormat(tokenizer, end_of_turn)
        self.model = model
        self.tokenizer = tokenizer
        self.end_of_turn = self.chat.end_of_turn
        self.eos_token_id: int = self.chat.eos_token_id
        """The end-of-turn token id (the last id of a finished response)."""
        self.stop_token_ids = self.chat.stop_token_ids
        self.pad_token_id: int = self.chat.pad_token_id
        self.max_context: int | None = getattr(model.config, "max_position_embeddings", None)
        """Most positions the model accepts (context plus response), if known."""
        self.tokens_computed = 0
        """Positions run through the model by ``sample`` so far (prefill plus fed-back
        tokens of rows still generating; padding and finished rows are not counted)."""
        self.logprob_chunk_tokens = 0
        """``response_logprobs`` and ``tree_logprobs`` score this many response tokens at
        a time (0: all at once); set during an update by
        :func:`turnrl.policy.memory_savers.memory_savers`."""
        self.autocast_dtype: torch.dtype | None = None
        """``response_logprobs`` and ``tree_logprobs`` run their forward under
        ``torch.autocast`` to this dtype (None: in the weights' own); set during a
        ``train.precision = "bf16-mixed"`` update by ``memory_savers``."""

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        end_of_turn: str | None = None,
        local_files_only: bool = True,
    ) -> HFPolicy:
        """Load model and tokenizer from a local directory (nothing is downloaded
        unless ``local_files_only=False``). A directory saved from a LoRA policy
        loads as base model + adapters (see :mod:`turnrl.policy.lora`)."""
        tokenizer = load_tokenizer(path, local_files_only=local_files_only)
        with transformers_progress_off():
            if lora.is_adapter_dir(path):
                model = lora.load_adapter_model(
                    path, dtype=dtype, local_files_only=local_files_only
                )
            else:
                model = AutoModelForCausalLM.from_pretrained(
                    str(path), dtype=dtype, local_files_only=local_files_only
                )
        return cls(model.to(device).eval(), tokenizer, end_of_turn=end_of_turn)

    def save(self, directory: str | Path) -> None:
        """Save model (or only its LoRA adapters) and tokenizer (with its chat
        template) for ``from_pretrained``."""
        with transformers_progress_off():
            if lora.is_adapter_model(self.model):
                lora.save_adapter_model(self.model, directory)
            else:
                self.model.save_pretrained(str(directory))
            self.tokenizer.save_pretrained(str(directory))

    def clone_frozen(self) -> HFPolicy:
        """An independent copy with gradients off and eval mode (e.g. a KL reference);
        LoRA adapters are merged into the copy."""
        if lora.is_adapter_model(self.model):
            model = lora.merged_copy(self.model).eval()
        else:
            model = copy.deepcopy(self.model).eval()
        model.requires_grad_(False)
        return HFPolicy(model, self.tokenizer, end_of_turn=self.end_of_turn)

    # ------------------------------------------------------------ passthroughs
    @property
    def device(self) -> torch.device:
        """Device of the model's parameters."""
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """Floating-point type of the model's parameters."""
        return next(self.model.parameters()).dtype

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The trainable parameters (for an optimiser): all of a plain model's, only
        the adapters of a LoRA model."""
        return (p for p in self.model.parameters() if p.requires_grad)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The model's state dict; only the adapter weights for a LoRA model."""
        if lora.is_adapter_model(self.model):
            return lora.adapter_state_dict(self.model)
        return self.model.state_dict()

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> Any:
        """Load a state dict from ``state_dict`` into the model."""
        if lora.is_adapter_model(self.model):
            return lora.load_adapter_state_dict(self.model, state)
        return self.model.load_state_dict(state)

    # ----------------------------------------------------------------- sampling
    @torch.inference_mode()
    def sample(
        self,
        contexts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        seed: int | Sequence[int] | None = None,
        prefix_cache: PrefixCache | None = None,
    ) -> list[Sample]:
        """Sample one response per context in one batched, KV-cached loop.

        Each row stops at an end-of-turn/eos token (``"stop"``, token included)
        or after ``max_new_tokens`` tokens (``"length"``); a row whose context
        nearly fills the model's positions stops earlier, also with ``"length"``.
        ``seed`` seeds a private ``torch.Generator`` (same seed and batch, same
        samples); ``None`` draws from a fresh random seed. ``seed`` may also be a
        list with one seed per context: each row then draws from its own generator,
        so its samples do not depend on which other rows share the batch (up to
        float rounding of the batched forward pass).

        With ``prefix_cache``, identical contexts are encoded once, cached prefixes
        are reused, rows decode as shared streams while their tokens agree, and the
        states of every ``context + response`` are stored for later calls (see
        :mod:`turnrl.policy.shared_decoding`). The samples are the same as without
        a cache (same seed and batch), up to float rounding. ``tokens_computed``
        counts the positions run through the model either way.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if not contexts:
            return []
        check_lengths(contexts, [1] * len(contexts), self.max_context)
        budgets = [
            max_new_tokens
            if self.max_context is None
            else min(max_new_tokens, self.max_context - len(c))
            for c in contexts
        ]
        generators = make_generators(seed, len(contexts), self.device)
        if prefix_cache is None:
            decoder = Decoder(self.model, self.stop_token_ids, self.pad_token_id)
        else:
            decoder = SharedDecoder(
                self.model, self.stop_token_ids, self.pad_token_id, prefix_cache
            )
        ids, logps, reasons = decoder.run(contexts, budgets, temperature, generators)
        self.tokens_computed += decoder.computed
        return [
            Sample(response_ids=r, logprobs=lp, stop_reason=str(why), text=self.decode(r))
            for r, lp, why in zip(ids, logps, reasons, strict=True)
        ]

    # ---------------------------------------------------------------- training
    def response_logprobs(
        self,
        contexts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs of given response tokens after given contexts, in one forward.

        Returns ``logp_B_T`` (float32, differentiable when grad is enabled; 0 at
        padding) and ``mask_B_T`` (float32, 1 for real response tokens), where
        ``T`` is the longest response. ``temperature`` must match the sampling
        temperature for these to equal ``Sample.logprobs``.
        """
        out = self._scored(row_scores, contexts, responses, temperature, padded=True)
        return out.logp_B_T, out.mask_B_T

    def tree_logprobs(
        self,
        contexts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
    ) -> LayoutLogprobs:
        """What ``response_logprobs`` returns, with every distinct token prefix of the
        rows computed once (see :mod:`turnrl.policy.tree_layout`)."""
        return self._scored(tree_logprobs, contexts, responses, temperature)

    def packed_logprobs(
        self,
        contexts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
    ) -> LayoutLogprobs:
        """What ``response_logprobs`` returns, the rows packed into one sequence without
        padding (see :mod:`turnrl.policy.packing`), with the positions run."""
        return self._scored(packed_logprobs, contexts, responses, temperature, padded=True)

    def _scored(
        self,
        layout: Callable[..., Any],
        contexts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        temperature: float,
        *,
        padded: bool = False,
    ) -> Any:
        """``layout``'s log-probs of the checked rows, with the update's chunking and
        autocast (``padded``: a layout that may pad, so it takes the pad id and device)."""
        check_pairs(contexts, responses, temperature)
        check_lengths(contexts, [len(r) for r in responses], self.max_context)
        extra = {"pad_token_id": self.pad_token_id, "device": self.device} if padded else {}
        with self._autocast():
            return layout(
                self.model,
                contexts,
                responses,
                temperature=temperature,
                chunk_tokens=self.logprob_chunk_tokens,
                **extra,
            )

    def _autocast(self) -> AbstractContextManager[Any]:
        """``torch.autocast`` to ``autocast_dtype`` on the model's device type, or nothing."""
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)
