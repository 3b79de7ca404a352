"""The statistics of ``turnrl study`` on hand-built numbers: ddof=1, paired
differences, the bootstrap against a direct numpy computation, the verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnrl.study import statistics as S


def test_mean_and_sample_sd() -> None:
    mean, sd = S.mean_sd([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5
    assert sd == pytest.approx(math.sqrt(5.0 / 3.0))  # sum of squares 5, divided by n - 1
    assert S.mean_sd([0.7])[0] == 0.7 and math.isnan(S.mean_sd([0.7])[1])


def test_paired_differences_keep_only_pairs() -> None:
    arm = {(0, 0): 0.5, (0, 1): 0.25, (0, 2): 1.0}
    base = {(0, 0): 0.25, (0, 1): 0.75}
    assert S.paired_differences(arm, base) == {(0, 0): 0.25, (0, 1): -0.5}


def test_one_level_bootstrap_is_the_direct_numpy_computation() -> None:
    diffs = {(0, k): v for k, v in enumerate([0.3, -0.1, 0.2, 0.5])}
    got = S.bootstrap_interval(diffs, resamples=2000, seed=7)
    values = np.array([0.3, -0.1, 0.2, 0.5])
    rng = np.random.default_rng(7)
    means = values[rng.integers(0, 4, size=(2000, 4))].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    assert (got.mean, got.low, got.high, got.n, got.levels) == (
        pytest.approx(0.225),
        low,
        high,
        4,
        1,
    )


def test_two_level_bootstrap_resamples_warm_starts_then_seeds() -> None:
    diffs = {(0, 0): 1.0, (0, 1): 2.0, (1, 0): -1.0, (1, 1): 0.0, (1, 2): 3.0}
    got = S.bootstrap_interval(diffs, resamples=500, seed=3)
    groups = [np.array([1.0, 2.0]), np.array([-1.0, 0.0, 3.0])]
    rng = np.random.default_rng(3)
    means = []
    for _ in range(500):
        drawn = rng.integers(0, 2, size=2)
        parts = [groups[g][rng.integers(0, groups[g].size, size=groups[g].size)] for g in drawn]
        means.append(np.concatenate(parts).mean())
    low, high = np.quantile(means, [0.025, 0.975])
    assert got.levels == 2 and got.n == 5
    assert got.mean == pytest.approx(1.0)
    assert (got.low, got.high) == (low, high)


def test_one_seed_per_warm_start_is_one_level() -> None:
    per_seed = {(k, k): v for k, v in enumerate([0.3, -0.1, 0.2])}
    shared = {(0, k): v for k, v in enumerate([0.3, -0.1, 0.2])}
    a, b = S.bootstrap_interval(per_seed, seed=1), S.bootstrap_interval(shared, seed=1)
    assert (a.low, a.high, a.levels) == (b.low, b.high, 1)


def test_verdict_flips_when_the_interval_crosses_zero() -> None:
    base = np.array([0.1, 0.2, 0.3])
    above = S.bootstrap_interval({(0, k): v for k, v in enumerate(base)})
    assert above.low == pytest.approx(0.1) and S.verdict(above) == S.HIGHER
    # shifted down by 0.15: the resample of three copies of -0.05 (1 in 27) is in the tail
    crossing = S.bootstrap_interval({(0, k): v for k, v in enumerate(base - 0.15)})
    assert crossing.low < 0 < crossing.high and S.verdict(crossing) == S.NOT_DETECTED
    below = S.bootstrap_interval({(0, k): v for k, v in enumerate(-base)})
    assert S.verdict(below) == S.LOWER
    assert S.verdict(S.bootstrap_interval({(0, 0): 5.0})) == S.TOO_FEW
    assert "refuted" not in " ".join([S.HIGHER, S.LOWER, S.NOT_DETECTED, S.ALL_EQUAL, S.TOO_FEW])
    same = S.bootstrap_interval({(0, k): 0.0 for k in range(4)})  # 4 pairs, all equal
    assert (same.low, same.high, S.verdict(same)) == (0.0, 0.0, S.ALL_EQUAL)


finite = st.floats(min_value=-10, max_value=10, allow_nan=False, allow_infinity=False)


@settings(max_examples=40, deadline=None)
@given(values=st.lists(finite, min_size=2, max_size=8), shift=finite)
def test_interval_properties(values: list[float], shift: float) -> None:
    diffs = {(0, k): v for k, v in enumerate(values)}
    got = S.bootstrap_interval(diffs, resamples=400)
    assert min(values) - 1e-9 <= got.low <= got.high <= max(values) + 1e-9
    # the same resamples: shifting every difference shifts the interval
    moved = S.bootstrap_interval({k: v + shift for k, v in diffs.items()}, resamples=400)
    assert moved.low == pytest.approx(got.low + shift, abs=1e-9)
    assert moved.high == pytest.approx(got.high + shift, abs=1e-9)
    # the verdict says what the interval says
    expected = (
        S.HIGHER
        if got.low > 0
        else S.LOWER
        if got.high < 0
        else S.ALL_EQUAL
        if got.low == got.high == 0
        else S.NOT_DETECTED
    )
    assert S.verdict(got) == expected


@settings(max_examples=30, deadline=None)
@given(half=st.lists(finite, min_size=1, max_size=5), center=finite)
def test_symmetric_differences_contain_their_mean(half: list[float], center: float) -> None:
    values = [center + v for v in half] + [center - v for v in half]
    got = S.bootstrap_interval({(0, k): v for k, v in enumerate(values)}, resamples=400)
    assert got.mean == pytest.approx(center, abs=1e-9)
    assert got.low - 1e-9 <= got.mean <= got.high + 1e-9
