"""Iterative GRPO's policy evaluation: MC returns on hand-built logs, Q fitting, Q metrics."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from turnrl.train.iterate.qmodel import (
    QExample,
    QFunction,
    build_q_model,
    choose_loss,
    fit_q,
    mc_returns,
    q_examples,
    split_by_group,
)
from turnrl.train.iterate.qquality import (
    average_ranks,
    expected_calibration_error,
    prediction_loss,
    reliability,
    spearman,
)
from turnrl.types import TurnRecord

torch.set_num_threads(1)


def record(traj: str, turn: int, reward: float, *, response=(5, 3)) -> TurnRecord:
    return TurnRecord(
        task_id="t",
        traj_id=traj,
        turn=turn,
        reward=reward,
        prompt_ids=(1, 2, turn),
        response_ids=tuple(response),
    )


# --------------------------------------------------------------------------- MC returns

LOGS = [  # rows deliberately out of trajectory order
    record("b", 1, -0.2),
    record("a", 0, 0.0),
    record("a", 2, 1.0),
    record("b", 0, 0.5),
    record("a", 1, 0.0),
]


def test_mc_returns_undiscounted_hand_built() -> None:
    np.testing.assert_allclose(mc_returns(LOGS, 1.0), [-0.2, 1.0, 1.0, 0.3, 1.0])


def test_mc_returns_discounted_hand_built() -> None:
    # a: G2 = 1, G1 = 0.5 * 1, G0 = 0.25;  b: G1 = -0.2, G0 = 0.5 + 0.5 * -0.2 = 0.4
    np.testing.assert_allclose(mc_returns(LOGS, 0.5), [-0.2, 0.25, 1.0, 0.4, 0.5])


def test_mc_returns_rejects_bad_gamma() -> None:
    with pytest.raises(ValueError, match="gamma"):
        mc_returns(LOGS, 1.5)


def test_q_examples_align_with_returns_and_skip_empty_responses() -> None:
    logs = [*LOGS, record("c", 0, 0.7, response=())]
    examples = q_examples(logs, 1.0)
    assert [e.target for e in examples] == pytest.approx([-0.2, 1.0, 1.0, 0.3, 1.0])
    assert [e.group for e in examples] == ["b", "a", "a", "b", "a"]
    assert examples[0].context == [1, 2, 1] and examples[0].response == [5, 3]


def test_q_examples_need_token_ids() -> None:
    bad = [TurnRecord(task_id="t", traj_id="x", turn=0, reward=1.0, response="hi")]
    with pytest.raises(ValueError, match="prompt_ids and response_ids"):
        q_examples(bad)


# --------------------------------------------------------------------------- metrics


def test_average_ranks_ties() -> None:
    np.testing.assert_allclose(average_ranks(np.array([3.0, 1.0, 3.0, 2.0])), [3.5, 1, 3.5, 2])


def test_spearman_exact_values() -> None:
    assert spearman(np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40])) == pytest.approx(1.0)
    assert spearman(np.array([1, 2, 3, 4]), np.array([4, 3, 2, 1])) == pytest.approx(-1.0)
    # ranks (1,2,3) vs (1,3,2): 1 - 6 * 2 / (3 * 8) = 0.5
    assert spearman(np.array([1, 2, 3]), np.array([1, 3, 2])) == pytest.approx(0.5)
    assert math.isnan(spearman(np.array([1, 1, 1]), np.array([1, 2, 3])))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-1000, 1000), min_size=2, max_size=30))
def test_spearman_invariant_under_monotone_maps(values: list[int]) -> None:
    a = np.array(values, dtype=float)
    b = np.arange(len(values), dtype=float)
    assert average_ranks(a).sum() == pytest.approx(len(a) * (len(a) + 1) / 2)
    direct, mapped = spearman(a, b), spearman(a**3 * 2 + 7, b)
    assert (math.isnan(direct) and math.isnan(mapped)) or direct == pytest.approx(mapped)


def test_reliability_and_ece_hand_built() -> None:
    pred = np.array([0.1, 0.2, 0.8, 0.9])
    target = np.array([0.0, 0.0, 1.0, 0.0])
    table = reliability(pred, target, bins=2)
    assert table == [
        {"pred_mean": pytest.approx(0.15), "target_mean": 0.0, "count": 2.0},
        {"pred_mean": pytest.approx(0.85), "target_mean": 0.5, "count": 2.0},
    ]
    assert expected_calibration_error(table) == pytest.approx(0.5 * 0.15 + 0.5 * 0.35)


def test_prediction_losses() -> None:
    assert prediction_loss(np.array([1.0, 3.0]), np.array([0.0, 1.0]), "mse") == 2.5
    expected = -(math.log(0.8) + math.log(0.6)) / 2
    assert prediction_loss(np.array([0.8, 0.4]), np.array([1.0, 0.0]), "bce") == pytest.approx(
        expected
    )


def test_choose_loss() -> None:
    assert choose_loss("auto", np.array([0.0, 1.0, 1.0])) == "bce"
    assert choose_loss("auto", np.array([0.0, 0.5])) == "mse"
    with pytest.raises(ValueError, match="bce"):
        choose_loss("bce", np.array([2.0]))


def test_split_by_group_keeps_conversations_whole() -> None:
    examples = [QExample([1], [2], 0.0, f"g{i // 3}") for i in range(30)]
    train, held = split_by_group(examples, 0.2, seed=3)
    assert {e.group for e in train}.isdisjoint({e.group for e in held})
    assert len({e.group for e in held}) == 2 and len(train) + len(held) == 30


# --------------------------------------------------------------------------- fitting


def synthetic(n: int, seed: int) -> tuple[list[QExample], np.ndarray]:
    """Known value function of token patterns: half from the state (a majority of
    token 10), half from the response (share of token 20)."""
    rng = np.random.default_rng(seed)
    examples, values = [], []
    for i in range(n):
        context = rng.integers(10, 12, size=5).tolist()
        response = rng.integers(20, 24, size=3).tolist()
        value = 0.5 * (context.count(10) >= 3) + 0.5 * response.count(20) / 3
        values.append(value)
        examples.append(QExample(context, response, float(value), f"c{i}"))
    return examples, np.array(values)


def test_q_fit_recovers_a_known_value_function() -> None:
    examples, _ = synthetic(400, seed=0)
    model = build_q_model(init="fresh", seed=0, hidden=32, layers=1)
    fit = fit_q(model, examples, steps=250, lr=3e-3, batch_size=32, seed=0)
    assert fit.q.loss == "mse"
    held = fit.heldout
    assert held["n"] == 80
    assert held["loss"] < 0.1 * held["baseline_loss"]
    assert held["spearman"] > 0.9 and held["ece"] < 0.05
    # unseen combinations: predictions match the true values
    fresh, truth = synthetic(50, seed=1)
    pred = fit.q.predict([e.context for e in fresh], [e.response for e in fresh])
    assert np.abs(pred - truth).mean() < 0.06


def test_q_fit_bce_is_calibrated_on_bernoulli_outcomes() -> None:
    examples, p = synthetic(2000, seed=2)
    rng = np.random.default_rng(5)
    outcomes = (rng.random(len(p)) < p).astype(float)
    binary = [
        QExample(e.context, e.response, float(y), e.group)
        for e, y in zip(examples, outcomes, strict=True)
    ]
    model = build_q_model(init="fresh", seed=0, hidden=32, layers=1)
    fit = fit_q(model, binary, steps=150, lr=3e-3, batch_size=64, seed=0)
    assert fit.q.loss == "bce"
    fresh, truth = synthetic(60, seed=3)
    pred = fit.q.predict([e.context for e in fresh], [e.response for e in fresh])
    assert np.all((pred > 0) & (pred < 1))
    assert np.abs(pred - truth).mean() < 0.1  # a constant would be off by 0.24
    assert fit.heldout["loss"] < fit.heldout["baseline_loss"] and fit.heldout["ece"] < 0.1


def test_q_save_load_round_trip(tmp_path: Path) -> None:
    examples, _ = synthetic(40, seed=4)
    fit = fit_q(build_q_model(init="fresh", seed=1, hidden=16, layers=1), examples, steps=3, seed=0)
    fit.q.save(tmp_path / "q")
    loaded = QFunction.load(tmp_path / "q")
    contexts, responses = [e.context for e in examples], [e.response for e in examples]
    np.testing.assert_allclose(
        loaded.predict(contexts, responses), fit.q.predict(contexts, responses), atol=1e-6
    )
    assert loaded.loss == fit.q.loss and loaded.target_mean == fit.q.target_mean


def test_q_init_from_policy_copies_the_backbone() -> None:
    from turnrl.policy import build_tiny_policy

    policy = build_tiny_policy(seed=0, hidden=32, layers=1)
    model = build_q_model(init="policy", seed=0, policy=policy)
    source = dict(policy.model.base_model.named_parameters())
    for name, parameter in model.backbone.named_parameters():
        assert torch.equal(parameter, source[name]) and parameter is not source[name]
    with pytest.raises(ValueError, match="needs the policy"):
        build_q_model(init="policy", seed=0)
