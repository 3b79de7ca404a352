"""``HFPolicy``: the ``Policy`` protocol on any transformers causal LM with a chat template.

Token exactness. Contexts grow by appending ids, never by re-rendering text:
``encode_initial(messages)`` once, then after every response its ids (ending with
the end-of-turn token) and ``encode_observation(message)``. For that to equal the
tokenisation of the re-rendered conversation, ``encode_observation`` returns the
ids of exactly the text the chat template puts after the end-of-turn token of an
assistant turn: the separator (e.g. Qwen's ``"\\n"``), the message, and the next
generation prompt. It finds that text as a delta between two renderings of a
reference conversation, with and without the message. Assumptions (true for
ChatML/Qwen-style templates and for the tiny template; tested on the latter):

* the template renders earlier messages the same whatever follows them, and
  the end-of-turn token's text is the last one in a rendered assistant turn;
* tokenisation does not merge across the end-of-turn special token, so
  tokenising the delta alone gives the same ids as inside the whole text.

Sampling. ``sample`` runs its own loop over the model's KV cache (one forward
per new token, the prompt is encoded once), with left padding, an attention
mask and explicit position ids, so every row sees exactly the positions it
would see alone. ``Sample.logprobs`` are log-probs of the sampled tokens under
the SAMPLING distribution, ``softmax(logits / temperature)``; ``response_logprobs``
with the same temperature recomputes them (with grad) for the PPO ratio. With
``temperature=0`` sampling is greedy and the recorded log-probs are under the
untempered distribution (temperature 1).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    PreTrainedTokenizerFast,
)

from turnrl.policy import lora
from turnrl.policy.prefix_cache import PrefixCache, Segment
from turnrl.types import Message, Sample

_REFERENCE_TURN: list[Message] = [
    {"role": "user", "content": "x"},
    {"role": "assistant", "content": "y"},
]
"""A conversation ending with an assistant turn, used to find observation deltas."""

_GENERIC_TOKENIZER_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def load_tokenizer(path: str | Path, *, local_files_only: bool = True) -> Any:
    """Load a tokenizer saved with ``save_pretrained``.

    A tokenizer saved as a generic ``tokenizers`` tokenizer (such as the tiny
    character-level one) is loaded as such: ``AutoTokenizer`` would otherwise
    replace it by the model type's own tokenizer class (transformers 5 does so
    for ``qwen2``), with a different pre-tokenizer and different ids.
    """
    config_file = Path(path) / "tokenizer_config.json"
    if config_file.is_file():
        declared = json.loads(config_file.read_text()).get("tokenizer_class")
        if declared in _GENERIC_TOKENIZER_CLASSES:
            return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path), local_files_only=local_files_only)


def _check_messages(messages: Sequence[Message], what: str) -> None:
    """Raise a clear error unless every message is a dict with str role and content."""
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(f"{what}[{i}]: expected a dict message, got {type(message).__name__}")
        for key in ("role", "content"):
            value = message.get(key)
            if not isinstance(value, str):
                raise ValueError(f"{what}[{i}]: field {key!r} must be a str, got {value!r}")


@dataclass
class _Prefill:
    """State after encoding the contexts of one ``sample`` call.

    The plain path has one row per context. The cached path has one row per
    distinct context (``contexts_U``) and keeps what decoding needs to share and
    store states: each context's row (``owner_B``), how much of it came from the
    cache and from which segment, and the width of the prefill layout (decode
    positions follow it).
    """

    logits_B_V: torch.Tensor
    cache: Any
    mask_B_L: torch.Tensor
    next_pos_B: torch.Tensor
    owner_B: list[int] = field(default_factory=list)
    cached_U: list[int] = field(default_factory=list)
    segments_U: list[Segment | None] = field(default_factory=list)
    width: int = 0
    contexts_U: list[list[int]] = field(default_factory=list)


@dataclass
class _Decoding:
    """Per-row results of a decoding loop: tokens, their log-probs, why each row ended."""

    ids: list[list[int]]
    logps: list[list[float]]
    reasons: list[str | None]

    @classmethod
    def empty(cls, rows: int) -> _Decoding:
        return cls([[] for _ in range(rows)], [[] for _ in range(rows)], [None] * rows)

    def __iter__(self):
        return iter((self.ids, self.logps, self.reasons))


class HFPolicy:
    """A chat policy backed by a transformers causal LM and its tokenizer.

    ``end_of_turn`` is the token that ends an assistant turn (default: the
    tokenizer's eos token, ``<|im_end|>`` for Qwen instruct models and the tiny
    model). Sampling stops at it or at the tokenizer's eos token.
    """

    def __init__(self, model: Any, tokenizer: Any, *, end_of_turn: str | None = None) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("HFPolicy needs a tokenizer with a chat template")
        self.model = model
        self.tokenizer = tokenizer
        self.end_of_turn = end_of_turn if end_of_turn is not None else tokenizer.eos_token
        if self.end_of_turn is None:
            raise ValueError("the tokenizer has no eos token; pass end_of_turn=")
        eot_ids = tokenizer.convert_tokens_to_ids([self.end_of_turn])
        if len(eot_ids) != 1 or eot_ids[0] is None or eot_ids[0] == tokenizer.unk_token_id:
            raise ValueError(f"end-of-turn {self.end_of_turn!r} is not a single token")
        self.eos_token_id: int = int(eot_ids[0])
        """The end-of-turn token id (the last id of a finished response)."""
        self.stop_token_ids = frozenset(
            i for i in (self.eos_token_id, tokenizer.eos_token_id) if i is not None
        )
        pad = tokenizer.pad_token_id
        self.pad_token_id: int = int(pad) if pad is not None else self.eos_token_id
        self.max_context: int | None = getattr(model.config, "max_position_embeddings", None)
        """Most positions the model accepts (context plus response), if known."""
        self.tokens_computed = 0
        """Positions run through the model by ``sample`` so far (prefill plus fed-back
        tokens of rows still generating; padding and finished rows are not counted)."""

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
        if lora.is_adapter_dir(path):
            model = lora.load_adapter_model(path, dtype=dtype, local_files_only=local_files_only)
        else:
            model = AutoModelForCausalLM.from_pretrained(
                str(path), dtype=dtype, local_files_only=local_files_only
            )
        return cls(model.to(device).eval(), tokenizer, end_of_turn=end_of_turn)

    def save(self, directory: str | Path) -> None:
        """Save model (or only its LoRA adapters) and tokenizer (with its chat
        template) for ``from_pretrained``."""
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

    # ----------------------------------------------------------------- encoding
    def _render(self, messages: Sequence[Message], *, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=generation_prompt, tokenize=False
        )

    def _encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_initial(self, messages: list[Message]) -> list[int]:
        """Ids of ``messages`` rendered by the chat template, plus the generation prompt."""
        if not messages:
            raise ValueError("encode_initial: messages is empty")
        _check_messages(messages, "messages")
        return self._encode_text(self._render(messages, generation_prompt=True))

    def observation_text(self, message: Message) -> str:
        """The text the template puts after an assistant's end-of-turn token when
        ``message`` follows: separator, the message, the next generation prompt."""
        _check_messages([message], "observation")
        before = self._render(_REFERENCE_TURN, generation_prompt=False)
        after = self._render([*_REFERENCE_TURN, message], generation_prompt=True)
        end = before.rfind(self.end_of_turn)
        if end < 0:
            raise ValueError(
                f"the chat template does not end an assistant turn with {self.end_of_turn!r}"
            )
        prefix = before[: end + len(self.end_of_turn)]
        if not after.startswith(prefix):
            raise ValueError(
                "the chat template re-renders earlier turns when a message is added; "
                "observation ids cannot be appended exactly"
            )
        return after[len(prefix) :]

    def encode_observation(self, message: Message) -> list[int]:
        """Ids to append after a finished response (see the module docstring)."""
        return self._encode_text(self.observation_text(message))

    def decode(self, ids: list[int]) -> str:
        """Text of response ids, without trailing end-of-turn/eos tokens."""
        ids = list(ids)
        while ids and ids[-1] in self.stop_token_ids:
            ids.pop()
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    # ----------------------------------------------------------------- checking
    def _check_lengths(self, contexts: Sequence[Sequence[int]], extra: Sequence[int]) -> None:
        """Clear errors for empty contexts and for ones too long for the model."""
        for i, (context, more) in enumerate(zip(contexts, extra, strict=True)):
            if len(context) == 0:
                raise ValueError(f"contexts[{i}] is empty")
            if self.max_context is not None and len(context) + more > self.max_context:
                raise ValueError(
                    f"contexts[{i}]: {len(context)} context tokens + {more} more exceed the "
                    f"model's max positions ({self.max_context})"
                )

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

        With ``prefix_cache``, identical contexts in the batch are encoded once,
        each context's longest cached prefix is taken from the cache instead of
        being recomputed, rows decode as shared streams while their tokens agree
        (see :meth:`_decode_shared`), and the states of every ``context +
        response`` are stored for later calls (see
        :mod:`turnrl.policy.prefix_cache`). The samples are the same as without a
        cache (same seed and batch), up to float rounding. ``tokens_computed``
        counts the positions run through the model either way.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if not contexts:
            return []
        self._check_lengths(contexts, [1] * len(contexts))
        budgets = [
            max_new_tokens
            if self.max_context is None
            else min(max_new_tokens, self.max_context - len(c))
            for c in contexts
        ]
        generators = self._generators(seed, len(contexts))
        decode = self._decode_plain if prefix_cache is None else self._decode_shared
        ids, logps, reasons = decode(contexts, budgets, temperature, generators, prefix_cache)
        return [
            Sample(response_ids=r, logprobs=lp, stop_reason=str(why), text=self.decode(r))
            for r, lp, why in zip(ids, logps, reasons, strict=True)
        ]

    def _record(
        self, draws: tuple[torch.Tensor, torch.Tensor], state: _Decoding, budgets: list[int]
    ) -> list[int]:
        """Append one drawn token to every unfinished row; return the rows that just ended."""
        token_B, logp_B = draws
        ended = []
        for i, (token, logp) in enumerate(zip(token_B.tolist(), logp_B.tolist(), strict=True)):
            if state.reasons[i] is not None:
                continue
            state.ids[i].append(token)
            state.logps[i].append(logp)
            if token in self.stop_token_ids:
                state.reasons[i] = "stop"
            elif len(state.ids[i]) >= budgets[i]:
                state.reasons[i] = "length"
            if state.reasons[i] is not None:
                ended.append(i)
        return ended

    def _decode_plain(
        self,
        contexts: list[list[int]],
        budgets: list[int],
        temperature: float,
        generators: list[torch.Generator],
        prefix_cache: None,
    ) -> _Decoding:
        """Every row prefilled and decoded on its own (finished rows keep stepping)."""
        prefill = self._prefill(contexts)
        logits_B_V, cache, mask_B_L, next_pos_B = (
            prefill.logits_B_V,
            prefill.cache,
            prefill.mask_B_L,
            prefill.next_pos_B,
        )
        batch = len(contexts)
        state = _Decoding.empty(batch)
        for _ in range(max(budgets)):
            token_B, logp_B = self._draw(logits_B_V, temperature, generators)
            self._record((token_B, logp_B), state, budgets)
            if all(r is not None for r in state.reasons):
                break
            # Finished rows keep stepping (their outputs are ignored).
            mask_B_L = torch.cat([mask_B_L, mask_B_L.new_ones(batch, 1)], dim=1)
            out = self.model(
                input_ids=token_B[:, None],
                attention_mask=mask_B_L,
                position_ids=next_pos_B[:, None],
                cache=cache,
                use_cache=True,
            )
            logits_B_V, cache = out.logits[:, -1, :], out.cache
            next_pos_B = next_pos_B + 1
        # Each row's last token is never fed back; finished rows' steps are not counted.
        self.tokens_computed += sum(len(r) - 1 for r in state.ids)
        return state

    def _decode_shared(
        self,
        contexts: list[list[int]],
        budgets: list[int],
        temperature: float,
        generators: list[torch.Generator],
        prefix_cache: PrefixCache | None,
    ) -> _Decoding:
        """Decode with shared streams: rows whose context and tokens so far are equal
        are one stream of the KV cache (one forward per step) until their draws differ.

        Each row still draws its own token from its stream's logits, with the same
        generators in the same order as :meth:`_decode_plain`, so the samples are
        the same. Finished rows leave their stream; the states of every distinct
        context and of every ``context + response[:-1]`` go into ``prefix_cache``.
        """
        assert prefix_cache is not None
        prefill = self._prefill_cached(contexts, prefix_cache)
        width = prefill.width
        cache = prefill.cache
        context_segment = [
            self._store_segment(
                prefix_cache,
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
        state = _Decoding.empty(len(contexts))
        for _ in range(max(budgets)):
            index_B = torch.tensor(stream_B, device=logits_S_V.device)
            token_B, logp_B = self._draw(logits_S_V[index_B], temperature, generators)
            for i in self._record((token_B, logp_B), state, budgets):
                sequence = [*contexts[i], *state.ids[i][:-1]]
                if len(state.ids[i]) > 1 and not prefix_cache.covers(sequence):
                    self._store_segment(
                        prefix_cache,
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
            mask_S_L = torch.cat([mask_S_L, mask_S_L.new_ones(len(parents), 1)], dim=1)
            out = self.model(
                input_ids=torch.tensor(tokens, device=logits_S_V.device)[:, None],
                attention_mask=mask_S_L,
                position_ids=next_pos_S[:, None],
                cache=cache,
                use_cache=True,
            )
            logits_S_V, cache = out.logits[:, -1, :], out.cache
            next_pos_S = next_pos_S + 1
            self.tokens_computed += len(parents)
        return state

    def _prefill(self, contexts: list[list[int]]) -> _Prefill:
        """Encode whole contexts, left-padded: the plain path, no reuse."""
        input_ids_B_L, mask_B_L = self._pad(contexts, left=True)
        position_B_L = (mask_B_L.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids_B_L,
            attention_mask=mask_B_L,
            position_ids=position_B_L,
            use_cache=True,
            logits_to_keep=1,
        )
        self.tokens_computed += sum(len(c) for c in contexts)
        return _Prefill(out.logits[:, -1, :], out.cache, mask_B_L, position_B_L[:, -1] + 1)

    def _parameter_signature(self) -> tuple[int, int]:
        """Changes whenever a parameter is modified in place (optimiser steps, loads)."""
        return id(self.model), sum(p._version for p in self.model.parameters())

    def _prefill_cached(self, contexts: list[list[int]], prefix_cache: PrefixCache) -> _Prefill:
        """Encode only what the cache lacks, once per distinct context (rows ``U``).

        Layout of unique row ``u`` (``P`` cached positions, ``S`` new ones, both
        padded to the batch maximum): ``[pad | cached P | pad | new S]``. The
        attention mask hides both pads and position ids are the absolute ones,
        so every row computes exactly what it would compute alone.
        """
        config = self.model.config
        if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
            raise ValueError("prefix_cache does not support sliding-window attention models")
        prefix_cache.bind(self._parameter_signature())
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
        out = self.model(
            input_ids=ids_U_S.to(device),
            attention_mask=mask_U_L.to(device),
            position_ids=position_U_S.to(device),
            cache=None if past is None else DynamicCache(ddp_cache_data=[tuple(kv) for kv in past]),
            use_cache=True,
            logits_to_keep=1,
        )
        self.tokens_computed += sum(new_U)
        return _Prefill(
            out.logits[:, -1, :],
            out.cache,
            mask_U_L.to(device),
            torch.tensor([len(row) for row in rows], device=device),
            owner_B=owner_B,
            cached_U=cached_U,
            segments_U=[segment for _, segment in found],
            width=max_cached + max_new,
            contexts_U=[list(row) for row in rows],
        )

    @staticmethod
    def _store_segment(
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

    def _generators(self, seed: int | Sequence[int] | None, rows: int) -> list[torch.Generator]:
        """One generator for the whole batch (``seed`` an int, or ``None`` for a fresh
        random seed), or one per row (``seed`` a sequence of ``rows`` ints)."""
        if seed is None or not isinstance(seed, Sequence):
            generator = torch.Generator(device=self.device)
            if seed is None:
                generator.seed()
            else:
                generator.manual_seed(int(seed))
            return [generator]
        if len(seed) != rows:
            raise ValueError(f"seed: {len(seed)} per-row seeds for {rows} contexts")
        return [torch.Generator(device=self.device).manual_seed(int(s)) for s in seed]

    @staticmethod
    def _draw(
        logits_B_V: torch.Tensor, temperature: float, generators: Sequence[torch.Generator]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw one token per row, with one generator for the batch or one per row;
        return it and its log-prob under the sampling distribution (temperature-scaled;
        untempered for greedy ``temperature=0``)."""
        logits_B_V = logits_B_V.float()
        if temperature == 0:
            token_B = logits_B_V.argmax(-1)
            logp_B_V = torch.log_softmax(logits_B_V, dim=-1)
        else:
            logp_B_V = torch.log_softmax(logits_B_V / temperature, dim=-1)
            probs_B_V = logp_B_V.exp()
            if len(generators) == 1:
                token_B = torch.multinomial(probs_B_V, 1, generator=generators[0]).squeeze(-1)
            else:
                rows = zip(probs_B_V, generators, strict=True)
                token_B = torch.cat([torch.multinomial(p_V, 1, generator=g) for p_V, g in rows])
        return token_B, logp_B_V.gather(-1, token_B[:, None]).squeeze(-1)

    def _pad(
        self, rows: Sequence[Sequence[int]], *, left: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pad rows to one length; return ids [B, L] and attention mask [B, L]."""
        length = max(len(r) for r in rows)
        ids_B_L = torch.full((len(rows), length), self.pad_token_id, dtype=torch.long)
        mask_B_L = torch.zeros((len(rows), length), dtype=torch.long)
        for i, row in enumerate(rows):
            span = slice(length - len(row), length) if left else slice(0, len(row))
            ids_B_L[i, span] = torch.tensor(list(row), dtype=torch.long)
            mask_B_L[i, span] = 1
        return ids_B_L.to(self.device), mask_B_L.to(self.device)

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
        if len(contexts) != len(responses):
            raise ValueError(
                f"{len(contexts)} contexts but {len(responses)} responses; they must pair up"
            )
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self._check_lengths(contexts, [len(r) for r in responses])
        device = self.device
        batch = len(contexts)
        longest = max((len(r) for r in responses), default=0)
        if batch == 0 or longest == 0:
            zeros = torch.zeros((batch, longest), device=device)
            return zeros, zeros.clone()
        seqs = [list(c) + list(r) for c, r in zip(contexts, responses, strict=True)]
        ids_B_L, mask_B_L = self._pad(seqs, left=False)
        length = ids_B_L.shape[1]
        # Only positions from the earliest response's predictor onwards need logits.
        start = min(len(c) for c in contexts) - 1
        out = self.model(
            input_ids=ids_B_L,
            attention_mask=mask_B_L,
            position_ids=torch.arange(length, device=device).expand(batch, length),
            use_cache=False,
            logits_to_keep=length - start,
        )
        logits_B_K_V = out.logits
        ctx_len_B = torch.tensor([len(c) for c in contexts], device=device)
        resp_len_B = torch.tensor([len(r) for r in responses], device=device)
        steps_T = torch.arange(longest, device=device)
        mask_B_T = (steps_T[None, :] < resp_len_B[:, None]).float()
        # Logit at absolute position p predicts token p + 1; kept index = p - start.
        index_B_T = (ctx_len_B[:, None] - 1 + steps_T[None, :] - start).clamp(
            max=logits_B_K_V.shape[1] - 1
        )
        picked_B_T_V = logits_B_K_V.gather(
            1, index_B_T[:, :, None].expand(-1, -1, logits_B_K_V.shape[-1])
        )
        targets_B_T = torch.zeros((batch, longest), dtype=torch.long, device=device)
        for i, response in enumerate(responses):
            targets_B_T[i, : len(response)] = torch.tensor(list(response), dtype=torch.long)
        logp_B_T_V = torch.log_softmax(picked_B_T_V.float() / temperature, dim=-1)
        logp_B_T = logp_B_T_V.gather(-1, targets_B_T[:, :, None]).squeeze(-1)
        return logp_B_T * mask_B_T, mask_B_T
