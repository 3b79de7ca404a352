"""The drift diagnostics every metrics row carries (and the trackers plot): mixed and
zero-advantage groups, rebuilt contexts and staleness, on hand-built records."""

from __future__ import annotations

import pytest

from turnrl.credit.audit import audit
from turnrl.credit.registry import compute_credit
from turnrl.records import parse_record
from turnrl.table import TurnTable
from turnrl.train.metrics import advantage_metrics, record_metrics


def row(task: str, traj: str, turn: int, prompt: str, reward: float, done: bool, **extra):
    return parse_record(
        {
            "task_id": task,
            "traj_id": traj,
            "turn": turn,
            "prompt": prompt,
            "response": "x",
            "reward": reward,
            "done": done,
            **extra,
        }
    )


def records() -> list:
    """Task A: two rollouts whose turns come from two contexts (``q``, ``q a``), different
    returns. Task B: two one-turn rollouts from one context, equal returns."""
    return [
        row("A", "a1", 0, "q", 0.0, False, context_rebuilt=False, policy_version=3),
        row("A", "a1", 1, "q a", 1.0, True, context_rebuilt=True, policy_version=3),
        row("A", "a2", 0, "q", 0.0, True, context_rebuilt=False, policy_version=4),
        row("B", "b1", 0, "r", 1.0, True, context_rebuilt=False, policy_version=4),
        row("B", "b2", 0, "r", 1.0, True, context_rebuilt=False, policy_version=4),
    ]


def test_drift_metrics_on_hand_built_groups() -> None:
    table = TurnTable.from_records(records())
    credit = compute_credit(table, "grpo_mixed")
    out = advantage_metrics(table, credit.advantages, "grpo_mixed", learner_version=4)
    # task groups: A mixes the contexts q and "q a"; B has one context and no signal
    assert out["mixed_group_frac"] == 0.5
    assert out["zero_adv_group_frac"] == 0.5
    assert out["context_rebuilt_frac"] == pytest.approx(1 / 5)
    assert out["staleness_mean"] == pytest.approx(2 / 5)
    assert out["staleness_max"] == 1.0
    # the same numbers `turnrl audit` reports for the estimator's group key
    (task_key,) = [k for k in audit(table).group_keys if k.key == "task"]
    assert out["mixed_group_frac"] == task_key.mixed_share


def test_exact_groups_do_not_mix() -> None:
    table = TurnTable.from_records(records())
    credit = compute_credit(table, "node")
    out = advantage_metrics(table, credit.advantages, "node")
    assert out["mixed_group_frac"] == 0.0
    assert "staleness_mean" not in out  # no learner version given


def test_records_that_say_nothing_give_no_rebuild_or_staleness() -> None:
    plain = [row("A", "a", 0, "q", 1.0, True)]
    assert record_metrics(plain, learner_version=5) == {}
