"""The statistics of a study: means, sample standard deviations, paired differences,
the paired t-interval, the exact sign-flip test, the verdict, and the power of a design.

Conventions (stated once, used by every table):

- A standard deviation is the sample standard deviation, ``ddof = 1`` (divide by
  ``n - 1``): the seeds are a sample of the seeds one could have run. With one value
  it is undefined (``nan``), never 0.
- Arms of one study share, for a given (warm start, seed), the tasks and the warm
  start: their runs are paired. Pairs are formed by that key, never by position (a
  missing seed in one arm drops that pair only). A comparison against the baseline arm
  is the mean of the per-pair differences ``arm - baseline``.
- The unit of inference: with one warm start (or one warm start per seed) the seed
  pair; with several warm starts shared by several seeds the warm start, whose value is
  the mean of its seeds' differences first (seeds of one warm start are not
  independent: the warm start can decide the outcome). The seed-level numbers are
  shown beside, labelled as not the unit.
- The interval is the paired t-interval of the units' mean (95%, ``n - 1`` degrees
  of freedom). The sign-flip test is exact: all ``2^n`` sign patterns of the units'
  differences, two-sided p = the share of patterns whose |mean| is at least the
  observed one. Its smallest p is ``2^(1-n)``: below 6 units it cannot reach 0.05.
- The verdict (the rule): "detected" only where the 95% t-interval excludes 0 and the
  t-test's p < 0.05 and, where the sign-flip test can reach 0.05 (n >= 6), its p <
  0.05 too. Below 6 units the verdict rests on the t-test alone and says that the
  sign-flip test cannot reach 0.05. Every verdict names its n, unit and tests. Not
  detecting a difference is never called a refutation.

The percentile bootstrap this replaces was anti-conservative with 3-8 pairs (false
positives 0.25 at n = 3, 0.16 at n = 5, 0.10 at n = 8 against the nominal 0.05):
``tests/test_study_statistics.py`` checks the verdict's false-positive rate and the
interval's coverage on simulated null data. scipy (``[train]``) gives the t and
noncentral t distributions.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import integrate, optimize, special
from scipy import stats as sps

LEVEL = 0.95
ALPHA = 0.05
POWER = 0.80
SIGN_FLIP_MIN_N = 6
"""The fewest units whose exact two-sided sign-flip p can fall below 0.05 (2^(1-6))."""
SIGN_FLIP_MAX_N = 20
"""All 2^n patterns are enumerated: up to a million (far above any study's units)."""

HIGHER = "higher, detected"
LOWER = "lower, detected"
NOT_DETECTED = "not detected"
ALL_EQUAL = "not detected (every pair equal)"
TOO_FEW = "not detected (fewer than 2 units)"


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``ddof = 1``; ``nan`` for one value)."""
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        return float("nan"), float("nan")
    sd = float(array.std(ddof=1)) if array.size > 1 else float("nan")
    return float(array.mean()), sd


def paired_differences(
    arm: Mapping[tuple[int, int], float], baseline: Mapping[tuple[int, int], float]
) -> dict[tuple[int, int], float]:
    """``arm - baseline`` for every (warm start, seed) key both have, in key order."""
    return {key: arm[key] - baseline[key] for key in sorted(arm) if key in baseline}


def by_warm_start(differences: Mapping[tuple[int, int], float]) -> list[np.ndarray]:
    """The values grouped by warm start (the first element of each key), in key order."""
    groups: dict[int, list[float]] = {}
    for (warm, _seed), value in sorted(differences.items()):
        groups.setdefault(warm, []).append(value)
    return [np.asarray(values, dtype=float) for values in groups.values()]


def units(differences: Mapping[tuple[int, int], float]) -> tuple[np.ndarray, str]:
    """The unit-level values and the unit's name: the warm starts' means where the pairs
    come from several warm starts that seeds share (some key's warm start is not its
    seed), even one seed each (smol-489-arms' seed 0 on three warm starts is three warm
    starts, not three seeds); otherwise (one warm start, or each seed its own warm start:
    keys (s, s), ``WarmStarts(per_seed=True)``) the seed pairs themselves."""
    groups = by_warm_start(differences)
    shared = any(warm != seed for warm, seed in differences)
    if len(groups) > 1 and shared:
        return np.array([group.mean() for group in groups]), "warm start"
    values = np.concatenate(groups) if groups else np.empty(0)
    return values, "seed"


@functools.cache
def _sign_patterns(n: int) -> np.ndarray:
    """Every pattern of ``n`` signs, one per row (``2^n`` rows)."""
    return np.array(list(itertools.product((1.0, -1.0), repeat=n)))


def sign_flip_p(values: Sequence[float]) -> float:
    """Exact two-sided sign-flip permutation p of the mean: the share of the ``2^n`` sign
    patterns whose |mean| is at least the observed |mean| (the observed pattern counts)."""
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        return float("nan")
    if array.size > SIGN_FLIP_MAX_N:
        raise ValueError(f"sign-flip test: {array.size} values, exact up to {SIGN_FLIP_MAX_N}")
    flipped = np.abs(_sign_patterns(array.size) @ array)
    observed = abs(array.sum())
    return float(np.mean(flipped >= observed - 1e-12 * max(1.0, observed)))


@dataclass(frozen=True)
class Test:
    """A mean difference with its paired t-interval and both tests' p-values."""

    mean: float
    low: float
    high: float
    n: int
    unit: str
    """``"seed"`` or ``"warm start"``: what ``n`` counts."""
    t_p: float
    sign_flip_p: float
    seed_level: Test | None = None
    """With warm starts as the unit: the same computation over the seed pairs (shown
    beside, not the verdict's)."""


def t_test(values: Sequence[float], unit: str = "seed") -> Test:
    """Mean, 95% paired t-interval, two-sided t p and exact sign-flip p of ``values``.

    Every value equal: the interval is that point, p = 0 unless it is 0 (p = 1)."""
    array = np.asarray(values, dtype=float)
    n = int(array.size)
    nan = float("nan")
    if n == 0:
        return Test(nan, nan, nan, 0, unit, nan, nan)
    mean = float(array.mean())
    if n < 2:
        return Test(mean, nan, nan, n, unit, nan, nan)
    se = float(array.std(ddof=1)) / np.sqrt(n)
    if se == 0.0:
        p = 1.0 if mean == 0.0 else 0.0
        return Test(mean, mean, mean, n, unit, p, sign_flip_p(array))
    # scipy.special's t cdf and its inverse: the same functions scipy.stats.t calls,
    # without its per-call overhead (the null-calibration test runs thousands)
    half = float(special.stdtrit(n - 1, 1.0 - (1.0 - LEVEL) / 2.0)) * se
    p = float(2.0 * special.stdtr(n - 1, -abs(mean) / se))
    return Test(mean, float(mean - half), float(mean + half), n, unit, p, sign_flip_p(array))


def paired_test(differences: Mapping[tuple[int, int], float]) -> Test:
    """The test of ``differences`` (keyed by (warm start, seed)) at the unit of
    :func:`units`, with the seed level beside when the unit is the warm start and some
    warm start holds more than one seed."""
    values, unit = units(differences)
    test = t_test(values, unit)
    if unit == "warm start" and len(differences) > len(values):  # some hold several seeds
        seeds = t_test(list(differences.values()), "seed")
        test = Test(test.mean, test.low, test.high, test.n, unit, test.t_p, test.sign_flip_p, seeds)
    return test


def units_text(n: int, unit: str) -> str:
    """``1 seed``, ``3 warm starts``."""
    return f"{n} {unit}{'s' if n != 1 else ''}"


def p_text(value: float) -> str:
    return "–" if np.isnan(value) else f"{value:.3f}"


def describe(test: Test) -> str:
    """``n = 3 seeds; paired t p = 0.041; sign-flip p = 0.250`` and, below 6 units, that
    the sign-flip test cannot reach 0.05."""
    text = f"n = {units_text(test.n, test.unit)}; paired t p = {p_text(test.t_p)}"
    text += f"; sign-flip p = {p_text(test.sign_flip_p)}"
    if 0 < test.n < SIGN_FLIP_MIN_N:
        text += f" (cannot reach 0.05 at n = {test.n}: smallest p {2.0 ** (1 - test.n):.3g})"
    return text


def detected(test: Test) -> bool:
    """The rule of the module docstring."""
    if test.n < 2 or np.isnan(test.low):
        return False
    excludes = test.low > 0 or test.high < 0
    sign_flip_ok = test.n < SIGN_FLIP_MIN_N or test.sign_flip_p < ALPHA
    return excludes and test.t_p < ALPHA and sign_flip_ok


def verdict_word(test: Test) -> str:
    """The verdict alone (no n, no tests): one of the module's constants."""
    if test.n < 2 or np.isnan(test.low):
        return TOO_FEW
    if test.low == test.high == 0:
        return ALL_EQUAL
    if detected(test):
        return HIGHER if test.mean > 0 else LOWER
    return NOT_DETECTED


def verdict(test: Test) -> str:
    """The wording the tests support, and no more, with the n, unit and tests named."""
    return f"{verdict_word(test)} ({describe(test)})"


def power(effect: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test at level ``alpha`` with ``n`` units whose
    differences have standard deviation ``sd``, against a true mean ``effect``
    (noncentral t with ``n - 1`` degrees of freedom)."""
    if n < 2 or sd <= 0:
        return float("nan")
    df = n - 1
    crit = float(sps.t.ppf(1.0 - alpha / 2.0, df))
    nc = abs(effect) / sd * np.sqrt(n)
    value = float(sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc))
    if np.isnan(value):  # scipy's noncentral t fails at 1 df and large nc: integrate
        value = _power_by_integral(crit, df, nc)
    return value


def _power_by_integral(crit: float, df: int, nc: float) -> float:
    """P(|T'| > crit) for T' = (Z + nc) / S, S = sqrt(chi2_df / df): the expectation over
    S of P(Z > crit S - nc) + P(Z < -crit S - nc)."""

    def integrand(s: float) -> float:
        density = sps.chi.pdf(s * np.sqrt(df), df) * np.sqrt(df)
        return float((special.ndtr(nc - crit * s) + special.ndtr(-nc - crit * s)) * density)

    return float(integrate.quad(integrand, 0.0, np.inf, epsabs=1e-12, limit=200)[0])


def minimum_detectable_effect(sd: float, n: int, target: float = POWER) -> float:
    """The smallest true mean difference the paired t-test detects with probability
    ``target`` at alpha 0.05 with ``n`` units of standard deviation ``sd``."""
    if n < 2 or not sd > 0:
        return float("nan")
    high = sd
    while power(high, sd, n) < target:
        high *= 2.0
    return float(optimize.brentq(lambda e: power(e, sd, n) - target, 0.0, high, xtol=1e-10))


def units_needed(effect: float, sd: float, target: float = POWER, most: int = 10_000) -> int:
    """The fewest units (>= 2) whose paired t-test detects ``effect`` with probability
    ``target`` (``most + 1`` when even ``most`` are not enough)."""
    if not sd > 0:
        raise ValueError(f"units_needed: sd must be > 0, got {sd}")
    if effect == 0:
        return most + 1
    for n in range(2, most + 1):
        if power(effect, sd, n) >= target:
            return n
    return most + 1
