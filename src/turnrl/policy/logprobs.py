"""Log-probs of given response tokens after given contexts, one padded row per pair.

The per-row recomputation the update uses with ``train.update = "rows"`` and the
reference every faster path is tested against: every row's whole context is run
through the model, right-padded, positions ``0..len-1``. (The tree layout,
:mod:`turnrl.policy.tree_layout`, computes the same numbers running every
distinct prefix once.)

With ``chunk_tokens > 0`` (``train.logprob_chunk_tokens``), neither layout lets the
model compute its logits: the decoder body gives hidden states, and
:func:`chunked_scored_tokens` runs the output layer, the tempered log-softmax and
the gather over that many tokens at a time, each chunk under
``torch.utils.checkpoint`` so that the backward recomputes a chunk's logits instead
of keeping them; no ``[tokens x vocab]`` float32 tensor is ever whole (docs/memory.md).

Every layout also returns each scored token's entropy under the same tempered
distribution (:func:`token_entropy`): a metric, never differentiated, computed from
the log-softmax the log-prob is gathered from, a bounded number of tokens at a time,
so it adds no ``[tokens x vocab]`` tensor of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.utils.checkpoint import checkpoint

from turnrl.policy.batching import pad_ids

TINY_TEMPERATURE = 1e-3
"""Below this temperature, :func:`tempered_log_softmax` divides max-shifted logits in
float64 (see there)."""


def tempered_log_softmax(logits_N_V: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` over the last axis, in float32, for every
    ``temperature > 0``.

    Tiny temperatures (any positive one is valid: a request's ``0 < t <= 2``, a
    config's ``policy.temperature > 0``) break the plain division in float32:
    ``1e-300`` becomes 0 there (``logits / 0`` is inf, then NaN), and ``1e-40``
    overflows every logit. Below :data:`TINY_TEMPERATURE` the logits are shifted so
    that their maximum is 0 (``log_softmax`` does not change) and divided in float64:
    the other logits go to large negative numbers (the lowest float32 at most, so that
    a padded position times its mask 0 stays 0), and the result is the exact limit of
    the distribution as the temperature goes to 0, the argmax with log-prob 0 (ties
    share the mass), instead of NaN. Sampling from it is greedy.

    Autocast is off inside: under ``train.precision = "bf16-mixed"`` the logits come
    in bfloat16 and are upcast before the division and the log-softmax.
    """
    with torch.autocast(logits_N_V.device.type, enabled=False):  # bf16-mixed: upcast
        if temperature >= TINY_TEMPERATURE:
            return torch.log_softmax(logits_N_V.float() / temperature, dim=-1)
        shifted = logits_N_V.double() - logits_N_V.double().amax(-1, keepdim=True)
        logp_N_V = torch.log_softmax(shifted / temperature, dim=-1).float()
        return logp_N_V.clamp_min(torch.finfo(torch.float32).min)  # finite: 0 * it is 0


ENTROPY_CHUNK_TOKENS = 256
"""Tokens per piece of :func:`token_entropy`: its temporaries are at most this many
rows of the vocabulary."""


class ScoredTokens(NamedTuple):
    """Per scored token: its log-prob (differentiable) and the entropy of the tempered
    distribution it was drawn from (float32, detached)."""

    logp: torch.Tensor
    entropy: torch.Tensor


@dataclass(frozen=True)
class LayoutLogprobs:
    """What an update layout returns for its rows (``HFPolicy.response_logprobs``'s
    contract), the entropies and the positions the forward ran."""

    logp_B_T: torch.Tensor
    """Log-probs of the response tokens (float32, 0 at padding; differentiable)."""
    mask_B_T: torch.Tensor
    """1 on real response tokens (float32)."""
    tokens_computed: int
    """Positions run through the model: the layout's size."""
    entropy_B_T: torch.Tensor
    """Entropy in nats of the tempered distribution each response token was scored
    under (float32, 0 at padding, detached): a metric, never a loss term."""

    @classmethod
    def scattered(
        cls,
        scores: ScoredTokens,
        mask_B_T: torch.Tensor,
        where: tuple[torch.Tensor, torch.Tensor],
        tokens_computed: int,
    ) -> LayoutLogprobs:
        """The per-token ``scores`` put at their ``(row, step)`` places ``where``, 0
        elsewhere (the log-probs keep their gradient)."""
        return cls(
            torch.zeros_like(mask_B_T).index_put(where, scores.logp),
            mask_B_T,
            tokens_computed,
            torch.zeros_like(mask_B_T).index_put(where, scores.entropy),
        )


def token_entropy(logp_N_V: torch.Tensor) -> torch.Tensor:
    """``-sum_v p_v log p_v`` over the last axis of a log-softmax, in nats, float32,
    without gradient, :data:`ENTROPY_CHUNK_TOKENS` rows at a time (a whole-tensor
    ``exp`` would be one more ``[tokens x vocab]`` float32 tensor at the update's
    peak). Probabilities that underflow to 0 contribute 0 (``entr(0) = 0``)."""
    with torch.no_grad():
        rows_N_V = logp_N_V.detach().float().reshape(-1, logp_N_V.shape[-1])
        parts = [
            torch.special.entr(piece.exp()).sum(-1)
            for piece in rows_N_V.split(ENTROPY_CHUNK_TOKENS)
        ]
        flat = torch.cat(parts) if parts else rows_N_V.new_zeros((0,))
        return flat.reshape(logp_N_V.shape[:-1])


def scored_tokens(
    logits_N_V: torch.Tensor, targets_N: torch.Tensor, temperature: float
) -> ScoredTokens:
    """Log-prob of each target under ``softmax(logits / temperature)``, in float32
    (:func:`tempered_log_softmax`: finite for every temperature > 0), and that
    distribution's entropy (:func:`token_entropy`)."""
    logp_N_V = tempered_log_softmax(logits_N_V, temperature)
    logp_N = logp_N_V.gather(-1, targets_N[..., None]).squeeze(-1)
    return ScoredTokens(logp_N, token_entropy(logp_N_V))


def output_parts(model: Any) -> tuple[Any, Any]:
    """``(decoder body, output layer)`` of a causal LM, through a peft wrapper (the LoRA
    layers are injected into the base model, so its body runs them).

    Only for models whose logits are ``output_layer(hidden)`` (Llama, Qwen2, SmolLM2):
    a model that scales or caps its logits after the output layer is refused."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for name in ("final_logit_softcapping", "logit_scale"):
        if getattr(base.config, name, None) not in (None, 1.0):
            raise ValueError(
                f"train.logprob_chunk_tokens needs logits = lm_head(hidden); this model's "
                f"config sets {name} (use train.logprob_chunk_tokens = 0)"
            )
    return base.get_decoder(), base.get_output_embeddings()


def _head_scores(
    head: Any, hidden_N_H: torch.Tensor, targets_N: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    logp_N, entropy_N = scored_tokens(head(hidden_N_H), targets_N, temperature)
    return logp_N, entropy_N


def chunked_scored_tokens(
    head: Any,
    hidden_N_H: torch.Tensor,
    targets_N: torch.Tensor,
    temperature: float,
    chunk_tokens: int,
) -> ScoredTokens:
    """:func:`scored_tokens` of ``head(hidden_N_H)``, ``chunk_tokens`` tokens at a time.

    With grad enabled each chunk runs under non-reentrant activation checkpointing: the
    forward keeps only the chunk's hidden states (already kept by the model), and the
    backward recomputes the chunk's logits and log-softmax, one chunk at a time (the
    entropy, made without gradient, saves nothing and is not needed there).
    The numbers are :func:`scored_tokens` on the whole logits (each token's logits
    depend on its own hidden state only)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    logps, entropies = [], []
    for hidden_C_H, targets_C in zip(
        hidden_N_H.split(chunk_tokens), targets_N.split(chunk_tokens), strict=True
    ):
        if torch.is_grad_enabled():
            logp_C, entropy_C = checkpoint(
                _head_scores, head, hidden_C_H, targets_C, temperature, use_reentrant=False
            )
        else:
            logp_C, entropy_C = _head_scores(head, hidden_C_H, targets_C, temperature)
        logps.append(logp_C)
        entropies.append(entropy_C)
    if not logps:
        empty = hidden_N_H.new_zeros((0,), dtype=torch.float32)
        return ScoredTokens(empty, empty.clone())
    return ScoredTokens(torch.cat(logps), torch.cat(entropies))


def check_pairs(
    contexts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], temperature: float
) -> None:
    """Clear errors for unpaired inputs and a non-positive temperature."""
    if len(contexts) != len(responses):
        raise ValueError(
            f"{len(contexts)} contexts but {len(responses)} responses; they must pair up"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def response_mask(
    responses: Sequence[Sequence[int]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mask_B_T`` (float32, 1 on real response tokens) and the right-padded targets
    ``targets_B_T`` (long, 0 at padding), ``T`` the longest response."""
    longest = max((len(r) for r in responses), default=0)
    lengths_B = torch.tensor([len(r) for r in responses], device=device)
    mask_B_T = (torch.arange(longest, device=device)[None, :] < lengths_B[:, None]).float()
    targets_B_T = torch.zeros((len(responses), longest), dtype=torch.long)
    for i, response in enumerate(responses):
        targets_B_T[i, : len(response)] = torch.tensor(list(response), dtype=torch.long)
    return mask_B_T, targets_B_T.to(device)


def row_scores(
    model: Any,
    contexts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    temperature: float,
    pad_token_id: int,
    device: torch.device,
    chunk_tokens: int = 0,
) -> LayoutLogprobs:
    """The responses' log-probs and entropies, every row encoded on its own in one
    padded forward (see ``HFPolicy.response_logprobs`` for the contract; the positions
    run are rows x longest row). ``chunk_tokens > 0`` scores the response tokens that
    many at a time (:func:`chunked_scored_tokens`); 0 lets the model compute the logits
    of every needed position at once."""
    batch = len(contexts)
    longest = max((len(r) for r in responses), default=0)
    if batch == 0 or longest == 0:
        zeros = torch.zeros((batch, longest), device=device)
        return LayoutLogprobs(zeros, zeros.clone(), 0, zeros.clone())
    seqs = [list(c) + list(r) for c, r in zip(contexts, responses, strict=True)]
    ids_B_L, mask_B_L = pad_ids(seqs, pad_token_id, left=False, device=device)
    length = ids_B_L.shape[1]
    inputs = {
        "input_ids": ids_B_L,
        "attention_mask": mask_B_L,
        "position_ids": torch.arange(length, device=device).expand(batch, length),
        "use_cache": False,
    }
    ctx_len_B = torch.tensor([len(c) for c in contexts], device=device)
    mask_B_T, targets_B_T = response_mask(responses, device)
    # Logit at absolute position p predicts token p + 1; only real tokens are scored.
    rows_N, steps_N = mask_B_T.nonzero(as_tuple=True)
    predictor_N = ctx_len_B[rows_N] - 1 + steps_N
    targets_N = targets_B_T[rows_N, steps_N]
    if chunk_tokens > 0:
        decoder, head = output_parts(model)
        hidden_N_H = decoder(**inputs).last_hidden_state[rows_N, predictor_N]
        scores = chunked_scored_tokens(head, hidden_N_H, targets_N, temperature, chunk_tokens)
    else:
        # Only positions from the earliest response's predictor onwards need logits.
        start = min(len(c) for c in contexts) - 1
        logits_B_K_V = model(**inputs, logits_to_keep=length - start).logits
        scores = scored_tokens(logits_B_K_V[rows_N, predictor_N - start], targets_N, temperature)
    return LayoutLogprobs.scattered(scores, mask_B_T, (rows_N, steps_N), batch * length)
