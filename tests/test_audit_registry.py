"""The audit reads what the estimator registry declares (``needs``, ``scale``) instead
of a list of estimator names: an estimator registered here, in a test, is skipped or
compared exactly as its declaration says."""

from __future__ import annotations

import pytest

from turnrl import TurnTable
from turnrl.credit import registry
from turnrl.credit.audit import audit
from turnrl.credit.registry import Credit, get_estimator

Q = [{"role": "user", "content": "q"}]


def _log(q: list[float | None] | None = None) -> TurnTable:
    """Four one-turn rollouts of one prompt, rewards 1, 1, 0, 0 (optionally with ``q``)."""
    rows = []
    for i, reward in enumerate([1.0, 1.0, 0.0, 0.0]):
        row = {"task_id": "t", "traj_id": f"r{i}", "turn": 0, "prompt": Q, "reward": reward}
        if q is not None and q[i] is not None:
            row["q"] = q[i]
        rows.append(row)
    return TurnTable.from_records(rows)


def test_q_declares_what_it_needs() -> None:
    assert get_estimator("q").needs == ("q",)
    assert {n: get_estimator(n).scale for n in ("grpo", "dr_grpo", "rloo", "node", "gigpo")} == {
        "grpo": "std",
        "dr_grpo": "mean",
        "rloo": "mean",
        "node": "mean",
        "gigpo": "mean",
    }


def test_estimators_missing_a_needed_field_are_skipped_with_the_reason() -> None:
    report = audit(_log())
    assert report.skipped == {
        "a2tgpo": "needs 'info_gain', which no row of this log has",
        "igpo": "needs 'info_gain', which no row of this log has",
        "q": "needs 'q', which no row of this log has",
    }
    # q on some rows only: the estimator's own record error (line and field).
    partial = audit(_log([0.5, None, 0.1, 0.2]), ["q"])
    assert list(partial.skipped) == ["q"]
    assert partial.skipped["q"] == (
        "<records>:2: field 'q': is missing (1 of 4 rows have no q); "
        "the 'q' estimator needs a q score on every row"
    )
    full = audit(_log([0.5, 0.4, 0.1, 0.2]), ["q"])
    assert full.skipped == {} and [e.estimator for e in full.estimators] == ["q"]


@pytest.mark.parametrize("scale", ["std", "mean"])
def test_a_new_estimator_is_audited_as_it_declares(monkeypatch, scale: str) -> None:
    """Returns minus the mean: equal to the mean-only node baseline, so its turn-0 gap is
    0 when declared ``"mean"`` and the distance to the std-scaled baseline otherwise."""

    def centred(table: TurnTable) -> Credit:
        return Credit(table.reward - table.reward.mean())

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register_estimator("centred", group_key="rollout", needs=("q",), scale=scale)(centred)
    assert audit(_log(), ["centred"]).skipped == {
        "centred": "needs 'q', which no row of this log has"
    }
    (row,) = audit(_log([0.0] * 4), ["centred"]).estimators
    # Node baseline with std: (+-0.5) / (sample std sqrt(1/3) + 1e-6).
    with_std = 0.5 / (3**-0.5 + 1e-6)
    expected = 0.0 if scale == "mean" else with_std - 0.5
    assert row.turn0_gap_mean_abs == pytest.approx(expected, abs=1e-12)


def test_an_unknown_scale_is_refused() -> None:
    with pytest.raises(ValueError, match="scale must be one of std, mean; got 'median'"):
        registry.register_estimator("x", group_key="node", scale="median")
