"""Tiny temperatures inside the documented range work (issue 38).

A request's temperature may be any ``0 <= t <= 2`` and ``policy.temperature`` any
``t > 0``; ``1e-300`` and ``1e-40`` used to give a 500 from the gateway
(``logits / t`` is NaN in float32) and a traceback in training. Now they sample the
limit distribution (the argmax, log-prob 0) and train on finite numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import hostile_requests as hostile
from conftest import PARITY, TINY_TRAIN
from serve_scripted import serving
from test_hostile_run import error_lines, read_jsonl
from turnrl.cli import main as turnrl_main
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.policy.logprobs import TINY_TEMPERATURE, tempered_log_softmax
from turnrl.serve import Gateway, GatewayServer

REPO = Path(__file__).resolve().parents[1]
LOWEST = torch.finfo(torch.float32).min
TINY = [1e-300, 1e-40, 1e-8]


# ------------------------------------------------------------------- the arithmetic


@pytest.mark.parametrize("temperature", TINY)
def test_a_tiny_temperature_gives_the_argmax_with_log_prob_0(temperature: float) -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0], [5.0, 5.0, -1.0]])
    logp = tempered_log_softmax(logits, temperature)
    # (logit - max) / t, at the lowest float32 (1e-300, 1e-40) or finite (1e-8)
    gap = [max(LOWEST, -2 / temperature), 0.0, max(LOWEST, -1 / temperature)]
    assert logp[0].tolist() == pytest.approx(gap, rel=1e-6)
    assert logp[1, :2].tolist() == pytest.approx([math.log(0.5)] * 2)  # a tie shares
    assert logp[1, 2].item() == pytest.approx(max(LOWEST, -6 / temperature), rel=1e-6)
    assert (logp * 0).tolist() == [[0.0] * 3, [0.0] * 3]  # a masked position stays 0


def test_temperatures_from_the_threshold_up_are_the_plain_division() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    for temperature in (TINY_TEMPERATURE, 0.7, 2.0):
        expected = torch.log_softmax(logits / temperature, dim=-1)
        assert torch.equal(tempered_log_softmax(logits, temperature), expected)


@settings(max_examples=50, deadline=None)
@given(
    logits=st.lists(st.floats(-50, 50, width=32), min_size=2, max_size=8),
    temperature=st.floats(1e-300, TINY_TEMPERATURE, exclude_max=True),
)
def test_below_the_threshold_it_is_finite_and_agrees_with_float64(
    logits: list[float], temperature: float
) -> None:
    row = torch.tensor([logits])
    logp = tempered_log_softmax(row, temperature)
    assert bool(torch.isfinite(logp).all())
    assert math.isclose(float(logp.exp().sum()), 1.0, rel_tol=1e-5)
    reference = torch.log_softmax(row.double() / temperature, dim=-1)
    finite = torch.isfinite(reference) & (reference > LOWEST)
    assert torch.allclose(logp[finite].double(), reference[finite], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------- the gateway


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    return build_tiny_policy(0)


@pytest.fixture
def served(policy: HFPolicy) -> Iterator[tuple[Gateway, GatewayServer]]:
    with serving(policy, default_max_tokens=4, batch_window_s=0.001) as pair:
        yield pair


@pytest.mark.parametrize("temperature", TINY)
def test_the_gateway_samples_greedily_at_a_tiny_temperature(
    served: tuple[Gateway, GatewayServer], temperature: float
) -> None:
    gateway, server = served
    url = f"{server.url}/rollouts/tiny-{temperature:g}/v1/chat/completions"
    greedy = hostile.send(url, body=hostile.chat_json(temperature=0), key=server.api_key)
    tiny = hostile.send(url, body=hostile.chat_json(temperature=temperature), key=server.api_key)
    assert (greedy.status, tiny.status) == (200, 200), tiny.text
    text = tiny.body["choices"][0]["message"]["content"]
    assert text == greedy.body["choices"][0]["message"]["content"]
    records = [r for r in gateway.views.records() if r.temperature == temperature]
    assert len(records) == 1
    assert list(records[0].logprobs) == [0.0] * len(records[0].logprobs)


# ------------------------------------------------------------------------- training


def test_training_at_policy_temperature_1e_minus_40_runs_on_finite_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    code = turnrl_main(
        [
            "train",
            "--quiet",
            "--config",
            str(REPO / "examples" / "calculator.toml"),
            "--run-dir",
            str(run_dir),
            *TINY_TRAIN,
            *PARITY,
            "train.steps=2",
            "policy.temperature=1e-40",
            "train.log_mismatch=true",
        ]
    )
    assert code == 0, error_lines(capsys.readouterr().err)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [row["step"] for row in rows] == [0, 1, 2]
    for row in rows[1:]:
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
