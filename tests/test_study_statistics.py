"""The statistics of ``turnrl study`` on hand-built numbers (ddof=1, pairs by key, the
paired t-interval worked by hand, the exact sign-flip p counted by hand, the warm start
as the unit, the verdict's rule, the power of a design) and its calibration on
simulated null data (false-positive rate and coverage, seeded)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

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


def test_three_pair_t_interval_by_hand() -> None:
    # differences 0.1, 0.2, 0.6: mean 0.3, sd sqrt(0.14 / 2), se sd / sqrt(3). With 2
    # degrees of freedom the t distribution's cdf is 1/2 + t / (2 sqrt(t^2 + 2)), so its
    # 0.975 quantile is 0.95 sqrt(2 / (1 - 0.95^2)) and the two-sided p of t is
    # 1 - t / sqrt(t^2 + 2).
    got = S.t_test([0.1, 0.2, 0.6])
    se = math.sqrt(0.07) / math.sqrt(3)
    quantile = 0.95 * math.sqrt(2 / (1 - 0.95**2))
    t = 0.3 / se
    assert quantile == pytest.approx(4.302652729749464, rel=1e-12)
    assert (got.n, got.unit) == (3, "seed")
    assert got.mean == pytest.approx(0.3, abs=1e-15)
    assert got.low == pytest.approx(0.3 - quantile * se, rel=1e-9)
    assert got.high == pytest.approx(0.3 + quantile * se, rel=1e-9)
    assert got.t_p == pytest.approx(1 - t / math.sqrt(t * t + 2), rel=1e-9)
    assert got.low == pytest.approx(sps.t.interval(0.95, 2, 0.3, se)[0], rel=1e-9)
    assert got.t_p == pytest.approx(0.18850, abs=1e-5)
    assert got.sign_flip_p == 0.25  # |sum| is the largest for 2 of the 8 patterns
    assert S.verdict(got) == (
        "not detected (n = 3 seeds; paired t p = 0.188; sign-flip p = 0.250 "
        "(cannot reach 0.05 at n = 3: smallest p 0.25))"
    )


def test_sign_flip_p_of_four_pairs_by_hand() -> None:
    # |values| 0.4, 0.3, 0.2, 0.1 sum to 1.0; the observed sum is 0.6. A pattern's |sum|
    # is >= 0.6 when the |values| it flips sum to <= 0.2 ({}, {0.1}, {0.2}) or >= 0.8
    # (their complements): 6 of 16 patterns.
    assert S.sign_flip_p([0.4, 0.3, -0.2, 0.1]) == 6 / 16
    assert S.sign_flip_p([1.0, 2.0, 3.0, 4.0]) == 2 / 16  # the smallest p at n = 4
    assert S.sign_flip_p([0.0, 0.0, 0.0]) == 1.0


def test_two_warm_starts_of_four_seeds_are_two_units() -> None:
    diffs = {(0, s): v for s, v in enumerate([0.1, 0.3, 0.2, 0.2])}
    diffs |= {(1, s): v for s, v in enumerate([0.5, 0.7, 0.6, 0.6])}
    got = S.paired_test(diffs)
    assert (got.n, got.unit) == (2, "warm start")
    assert got.mean == pytest.approx(0.4)  # the mean of the warm starts' means 0.2, 0.6
    # two units, sd of (0.2, 0.6) = 0.2 sqrt(2), se 0.2; t = 2 with 1 degree of freedom:
    # the Cauchy distribution, two-sided p = 1 - 2 atan(2) / pi
    assert got.t_p == pytest.approx(1 - 2 * math.atan(2.0) / math.pi, rel=1e-9)
    assert got.seed_level is not None and got.seed_level.n == 8
    assert got.seed_level.unit == "seed" and got.seed_level.t_p < 0.01  # not the unit
    assert S.verdict_word(got) == S.NOT_DETECTED
    # one warm start, or each seed its own warm start (per_seed): the seed is the unit
    assert S.paired_test({(0, s): 0.1 * s for s in range(4)}).unit == "seed"
    own = S.paired_test({(s, s): 0.1 * s for s in range(4)})
    assert (own.n, own.unit, own.seed_level) == (4, "seed", None)
    # seed 0 on three shared warm starts: three warm starts, no seed level beside
    shared = S.paired_test({(w, 0): 0.1 * w for w in range(3)})
    assert (shared.n, shared.unit, shared.seed_level) == (3, "warm start", None)
    assert S.describe(shared).startswith("n = 3 warm starts; paired t p = ")
    assert (S.units_text(1, "seed"), S.units_text(2, "seed")) == ("1 seed", "2 seeds")
    # a second seed on one of them: still three units, the four pairs beside
    uneven = S.paired_test({(0, 0): 0.1, (0, 1): 0.3, (1, 0): 0.5, (2, 0): 0.6})
    assert (uneven.n, uneven.unit) == (3, "warm start")
    assert uneven.mean == pytest.approx((0.2 + 0.5 + 0.6) / 3)
    assert uneven.seed_level is not None and uneven.seed_level.n == 4


def test_the_verdict_rule() -> None:
    # six units all above 0: t p well below 0.05 and sign-flip p = 2 / 64
    up = S.t_test([1.0, 1.1, 0.9, 1.2, 1.0, 0.8])
    assert up.sign_flip_p == 2 / 64 and S.verdict_word(up) == S.HIGHER
    assert S.verdict_word(S.t_test([-v for v in (1.0, 1.1, 0.9, 1.2, 1.0, 0.8)])) == S.LOWER
    # one small negative: the t-test still rejects, the sign-flip test (4 / 64) does not
    mixed = S.t_test([1.0, 1.1, 0.9, 1.2, 1.0, -0.1])
    assert mixed.t_p < 0.01 and mixed.sign_flip_p == 4 / 64
    assert mixed.low > 0 and S.verdict_word(mixed) == S.NOT_DETECTED
    # below six units the t-test alone decides, and the verdict says why
    few = S.t_test([1.0, 1.1, 0.9])
    assert S.verdict(few).startswith("higher, detected (n = 3 seeds; paired t p = 0.")
    assert "cannot reach 0.05 at n = 3: smallest p 0.25" in S.verdict(few)
    same = S.t_test([0.0] * 4)
    assert (same.low, same.high, S.verdict_word(same)) == (0.0, 0.0, S.ALL_EQUAL)
    assert S.verdict_word(S.t_test([5.0])) == S.TOO_FEW
    words = [S.HIGHER, S.LOWER, S.NOT_DETECTED, S.ALL_EQUAL, S.TOO_FEW]
    assert "refuted" not in " ".join(words)


def _null_false_positives(draw, n: int, trials: int) -> float:
    return float(np.mean([S.detected(S.t_test(draw(n))) for _ in range(trials)]))


@pytest.mark.parametrize("n", [3, 5, 8])
def test_null_false_positive_rate_and_coverage(n: int) -> None:
    rng = np.random.default_rng(40 + n)
    trials = 2000
    normal = _null_false_positives(lambda k: rng.normal(0.0, 0.1, k), n, trials)
    heavy = _null_false_positives(lambda k: 0.1 * rng.standard_t(2, k), n, trials)
    assert normal <= 0.06 and heavy <= 0.06, (normal, heavy)
    # the old percentile bootstrap's rate at n = 3 was 0.25: the check can fail
    covered = []
    for _ in range(trials):
        test = S.t_test(rng.normal(0.3, 0.2, n))
        covered.append(test.low <= 0.3 <= test.high)
    assert 0.93 <= float(np.mean(covered)) <= 0.97


def test_warm_start_clusters_keep_the_null_rate() -> None:
    # 3 warm starts x 4 seeds, the warm start moving every seed's difference (sd 0.2)
    # more than the seeds do (sd 0.05): pooling the 12 seed pairs would be
    # anti-conservative; the warm start as the unit is not.
    rng = np.random.default_rng(7)
    unit, pooled = [], []
    for _ in range(2000):
        shift = rng.normal(0.0, 0.2, 3)
        diffs = {(w, s): shift[w] + rng.normal(0.0, 0.05) for w in range(3) for s in range(4)}
        test = S.paired_test(diffs)
        unit.append(S.detected(test))
        pooled.append(test.seed_level is not None and test.seed_level.t_p < 0.05)
    assert float(np.mean(unit)) <= 0.06
    assert float(np.mean(pooled)) > 0.3  # why the seed level is not the verdict's


def test_power_and_minimum_detectable_effect() -> None:
    assert S.power(0.0, 1.0, 5) == pytest.approx(0.05, abs=1e-12)  # no effect: alpha
    mde = S.minimum_detectable_effect(1.0, 3)
    assert mde == pytest.approx(3.264, abs=1e-3)  # the "about 3.25 sd at n = 3"
    assert S.power(mde, 1.0, 3) == pytest.approx(0.8, abs=1e-9)
    assert S.minimum_detectable_effect(2.0, 8) == pytest.approx(
        2 * S.minimum_detectable_effect(1.0, 8)
    )
    needed = S.units_needed(0.5, 1.0)
    assert S.power(0.5, 1.0, needed) >= 0.8 > S.power(0.5, 1.0, needed - 1)
    assert math.isnan(S.minimum_detectable_effect(1.0, 1))


finite = st.floats(min_value=-10, max_value=10, allow_nan=False, allow_infinity=False)


@settings(max_examples=40, deadline=None)
@given(values=st.lists(finite, min_size=2, max_size=8), shift=finite)
def test_interval_properties(values: list[float], shift: float) -> None:
    got = S.t_test(values)
    assert got.low <= got.mean <= got.high
    moved = S.t_test([v + shift for v in values])
    assert moved.low == pytest.approx(got.low + shift, abs=1e-6)
    assert moved.high == pytest.approx(got.high + shift, abs=1e-6)
    assert S.sign_flip_p([-v for v in values]) == S.sign_flip_p(values)
    assert 2.0 ** (1 - len(values)) <= S.sign_flip_p(values) <= 1.0
    # detected implies the interval excludes 0 on the side of the mean
    if S.detected(got):
        assert (got.low > 0 and got.mean > 0) or (got.high < 0 and got.mean < 0)
