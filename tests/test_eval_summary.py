"""turnrl eval's statistics: the unbiased pass@k estimator (Chen et al. 2021), the
per-task rows and the breakdown by route and kind, on hand-built episodes."""

from __future__ import annotations

from itertools import combinations
from math import comb

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnrl.train.eval_summary import EpisodeOutcome, breakdown, pass_at_k, pass_ks, task_rows


def outcome(task: str, kind: str, success: bool, calls: int, tokens: int = 10) -> EpisodeOutcome:
    return EpisodeOutcome(
        task, (kind,), f"{task}-{tokens}", success, float(success), 2, calls, tokens
    )


def test_pass_at_k_exact_values() -> None:
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-15)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4, abs=1e-15)  # k=1: c/n
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 1, 4) == 1.0  # n - c < k: every draw of 4 holds the success
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - comb(7, 5) / comb(10, 5), abs=1e-15)


@given(
    st.integers(1, 12).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))
    )
)
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_success(nck: tuple[int, int, int]) -> None:
    """The estimator equals its definition: the share of the C(n, k) subsets of k
    samples that hold at least one success (enumerated)."""
    n, c, k = nck
    samples = [True] * c + [False] * (n - c)
    subsets = list(combinations(range(n), k))
    share = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(share, abs=1e-12)


def test_pass_at_k_refuses_k_above_n() -> None:
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


def test_pass_ks() -> None:
    assert pass_ks(1) == [1]
    assert pass_ks(3) == [1, 2, 3]
    assert pass_ks(10) == [1, 2, 4, 8, 10]


def test_breakdown_by_route_and_kind() -> None:
    episodes = [
        outcome("a", "hard", True, 1, tokens=10),
        outcome("a", "hard", False, 0, tokens=20),
        outcome("b", "hard", False, 0, tokens=30),
        outcome("b", "hard", False, 2, tokens=40),
        outcome("c", "easy", True, 0, tokens=50),
        outcome("c", "easy", True, 0, tokens=60),
    ]
    table = breakdown(episodes, [1, 2])
    assert list(table) == ["all", "easy", "hard"]
    hard = table["hard"]
    assert hard["tasks"] == 2 and hard["episodes"] == 4
    assert hard["success"] == 0.25
    assert hard["pass@1"] == 0.25  # mean over tasks of c/n: (1/2 + 0/2) / 2
    assert hard["pass@2"] == 0.5  # task a: 1, task b: 0
    assert hard["tool_call_rate"] == 0.5
    assert hard["success_called"] == 0.5  # a's call succeeded, b's did not
    assert hard["success_direct"] == 0.0
    assert hard["tokens"] == 25.0 and hard["turns"] == 2.0
    easy = table["easy"]
    assert easy["success_called"] is None and easy["success_direct"] == 1.0
    assert table["all"]["success"] == 0.5 and table["all"]["pass@2"] == pytest.approx(2 / 3)


def test_task_rows_keep_every_sample() -> None:
    rows = task_rows([outcome("a", "hard", True, 1), outcome("a", "hard", False, 0)], [1, 2, 4])
    (row,) = rows
    assert row["samples"] == 2 and row["successes"] == 1
    assert row["pass@1"] == 0.5 and row["pass@2"] == 1.0 and "pass@4" not in row
    assert [e["success"] for e in row["episodes"]] == [True, False]
    assert row["kinds"] == ["hard"] and row["tool_call_rate"] == 0.5
