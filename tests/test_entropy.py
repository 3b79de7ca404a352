"""The policy's entropy: computed per scored token from the log-softmax its log-prob comes
from, in bounded pieces, the same in every update layout and with every memory saver,
and reported by the update as the mean over the trained tokens (``entropy``)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import GradientRecorder
from test_ppo import ONE_STEP, policy, sampled_batch
from turnrl.policy.logprobs import ENTROPY_CHUNK_TOKENS, scored_tokens, token_entropy
from turnrl.policy.memory_savers import memory_savers
from turnrl.train.update.ppo import ppo_update

torch.set_num_threads(1)

CONTEXTS = [[1, 2, 3], [1, 2, 3], [1, 2, 3, 4, 5, 7], [5, 6], [1, 2, 3]]
RESPONSES = [[4, 5, 9], [4, 6], [8, 2, 2, 3], [1, 1], [4, 5]]
TEMPERATURE = 0.7


def test_entropy_of_hand_built_distributions() -> None:
    logits_N_V = torch.tensor(
        [
            [0.0, 0.0, 0.0, 0.0],  # uniform over 4: ln 4
            [0.0, 0.5 * math.log(3.0), -1e30, -1e30],  # at t = 0.5: p = (1/4, 3/4, 0, 0)
        ]
    )
    scores = scored_tokens(logits_N_V, torch.tensor([2, 1]), 0.5)
    h_quarter = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert scores.entropy.tolist() == pytest.approx([math.log(4.0), h_quarter], abs=1e-6)
    assert scores.logp.tolist() == pytest.approx([math.log(0.25), math.log(0.75)], abs=1e-6)
    assert not scores.entropy.requires_grad


def test_a_tiny_temperature_gives_the_greedy_limits_entropy() -> None:
    # two tied maxima share the mass as the temperature goes to 0: ln 2; a single one: 0
    logits_N_V = torch.tensor([[1.0, 1.0, 0.0], [3.0, 1.0, 0.0]])
    scores = scored_tokens(logits_N_V, torch.tensor([0, 0]), 1e-300)
    assert scores.entropy.tolist() == pytest.approx([math.log(2.0), 0.0], abs=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    tokens=st.integers(0, 3 * ENTROPY_CHUNK_TOKENS),
    vocab=st.integers(1, 9),
    seed=st.integers(0, 10_000),
)
def test_pieces_agree_with_the_whole_and_stay_in_bounds(tokens: int, vocab: int, seed: int) -> None:
    logits_N_V = 4 * torch.randn(tokens, vocab, generator=torch.Generator().manual_seed(seed))
    logp_N_V = torch.log_softmax(logits_N_V, -1)
    entropy_N = token_entropy(logp_N_V)
    whole_N = -(logp_N_V.exp() * logp_N_V).sum(-1)
    assert entropy_N.shape == (tokens,)
    assert torch.allclose(entropy_N, whole_N, atol=1e-5, rtol=0)
    assert bool((entropy_N >= -1e-6).all()) and bool((entropy_N <= math.log(vocab) + 1e-5).all())


def _direct_entropy_B_T(model, temperature: float) -> torch.Tensor:
    """Each response token's entropy from the full logits of its row run alone."""
    rows = []
    with torch.no_grad():
        for context, response in zip(CONTEXTS, RESPONSES, strict=True):
            ids = torch.tensor([[*context, *response]])
            logits_L_V = model.model(input_ids=ids).logits[0]
            predictors = logits_L_V[len(context) - 1 : len(context) - 1 + len(response)]
            logp_T_V = torch.log_softmax(predictors / temperature, -1)
            rows.append(-(logp_T_V.exp() * logp_T_V).sum(-1))
    out = torch.zeros(len(rows), max(len(r) for r in RESPONSES))
    for b, row in enumerate(rows):
        out[b, : len(row)] = row
    return out


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("chunk", [0, 2])
def test_every_layout_gives_each_tokens_entropy(chunk: int, checkpointing: bool) -> None:
    model = policy()
    model.model.train()
    expected_B_T = _direct_entropy_B_T(model, TEMPERATURE)
    with memory_savers(model, gradient_checkpointing=checkpointing, logprob_chunk_tokens=chunk):
        layouts = {
            "tree": model.tree_logprobs(CONTEXTS, RESPONSES, temperature=TEMPERATURE),
            "packed": model.packed_logprobs(CONTEXTS, RESPONSES, temperature=TEMPERATURE),
        }
        for name, out in layouts.items():
            assert not out.entropy_B_T.requires_grad, name
            assert torch.allclose(out.entropy_B_T, expected_B_T, atol=1e-6, rtol=0), name
            # the log-probs still carry the gradient
            out.logp_B_T.sum().backward()
    assert float(expected_B_T.sum()) > 0


@pytest.mark.parametrize("update", ["rows", "tree"])
def test_the_update_reports_the_mean_entropy_of_the_trained_tokens(update: str) -> None:
    model = policy()
    batch = sampled_batch(model, 0.7)
    # split into forwards of a few positions each: their means are merged per token
    config = replace(ONE_STEP, update=update, max_tokens_per_batch=16)
    recorder = GradientRecorder(model.parameters())  # records, never steps: one policy
    stats = ppo_update(model, recorder, batch, config, temperature=0.7, reference=None, seed=0)
    entropies = []
    with torch.no_grad():
        for context, response in zip(batch.contexts, batch.responses, strict=True):
            logits_L_V = model.model(input_ids=torch.tensor([[*context, *response]])).logits[0]
            predictors = logits_L_V[len(context) - 1 : len(context) - 1 + len(response)]
            logp_T_V = torch.log_softmax(predictors / 0.7, -1)
            entropies.extend((-(logp_T_V.exp() * logp_T_V).sum(-1)).tolist())
    assert stats["entropy"] == pytest.approx(sum(entropies) / len(entropies), abs=1e-5)
    assert 0 < stats["entropy"] <= math.log(model.model.config.vocab_size)
