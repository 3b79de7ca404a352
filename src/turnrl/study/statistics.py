"""The statistics of a study: means, sample standard deviations, paired differences
and bootstrap confidence intervals, and the verdict worded by the interval.

Conventions (stated once, used by every table):

- A standard deviation is the sample standard deviation, ``ddof = 1`` (divide by
  ``n - 1``): the seeds are a sample of the seeds one could have run. With one value
  it is undefined (``nan``), never 0.
- Arms of one study share, for a given (warm start, seed), the tasks and the warm
  start: their runs are paired. A comparison against the baseline arm is the mean of
  the per-pair differences ``arm - baseline``, never a difference of two means of
  unpaired runs.
- Confidence intervals are percentile bootstrap intervals of that mean. Seeds are
  resampled with replacement; with several warm starts the bootstrap has two
  levels: warm starts are resampled, then seeds within each drawn warm start (the
  seed spread alone understates how much a result depends on the warm start).
  With few seeds the bootstrap interval is narrow and coarse (3 seeds give 10
  distinct resamples): it is a description of the seeds run, not a test.
- The verdict reads the interval only: "higher, detected" when it lies above 0,
  "lower, detected" when below, "not detected (every pair equal)" when it is the
  point 0, "not detected (CI crosses 0)" otherwise. Not
  detecting a difference is never called a refutation.

numpy only (this module must run wherever the tables are rebuilt).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_RESAMPLES = 10_000
DEFAULT_LEVEL = 0.95
DEFAULT_BOOTSTRAP_SEED = 0
"""The bootstrap's own random stream is fixed, so a summary is a function of the runs."""

HIGHER = "higher, detected"
LOWER = "lower, detected"
NOT_DETECTED = "not detected (CI crosses 0)"
ALL_EQUAL = "not detected (every pair equal)"
TOO_FEW = "not detected (fewer than 2 pairs)"


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
    """``arm - baseline`` for every (warm start, seed) pair both have, in key order."""
    return {key: arm[key] - baseline[key] for key in sorted(arm) if key in baseline}


def by_warm_start(differences: Mapping[tuple[int, int], float]) -> list[np.ndarray]:
    """The values grouped by warm start (the first element of each key), in key order."""
    groups: dict[int, list[float]] = {}
    for (warm, _seed), value in sorted(differences.items()):
        groups.setdefault(warm, []).append(value)
    return [np.asarray(values, dtype=float) for values in groups.values()]


def bootstrap_means(
    groups: Sequence[np.ndarray], resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Bootstrap replicates of the mean of all values.

    One group: the values are resampled with replacement. Several groups (warm
    starts): first the groups are resampled with replacement, then, inside each drawn
    group, its values; a replicate is the mean of everything drawn."""
    if len(groups) == 1:
        values = groups[0]
        picks = rng.integers(0, values.size, size=(resamples, values.size))
        return values[picks].mean(axis=1)
    replicates = np.empty(resamples)
    for r in range(resamples):
        drawn = rng.integers(0, len(groups), size=len(groups))
        parts = [groups[g][rng.integers(0, groups[g].size, size=groups[g].size)] for g in drawn]
        replicates[r] = np.concatenate(parts).mean()
    return replicates


@dataclass(frozen=True)
class Interval:
    """A mean with its percentile bootstrap interval."""

    mean: float
    low: float
    high: float
    n: int
    levels: int
    """1: seeds resampled; 2: warm starts, then seeds within them."""


def bootstrap_interval(
    differences: Mapping[tuple[int, int], float],
    *,
    level: float = DEFAULT_LEVEL,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
) -> Interval:
    """The mean of ``differences`` (keyed by (warm start, seed)) and its bootstrap
    interval; two levels when the keys hold more than one warm start."""
    groups = by_warm_start(differences)
    if all(group.size == 1 for group in groups):  # one seed per warm start: one level
        groups = [np.concatenate(groups)] if groups else []
    n = sum(group.size for group in groups)
    if n == 0:
        nan = float("nan")
        return Interval(nan, nan, nan, 0, 0)
    mean = float(np.concatenate(groups).mean())
    if n < 2:
        return Interval(mean, float("nan"), float("nan"), n, 0)
    replicates = bootstrap_means(groups, resamples, np.random.default_rng(seed))
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(replicates, [alpha, 1.0 - alpha])
    return Interval(mean, float(low), float(high), n, 1 if len(groups) == 1 else 2)


def verdict(interval: Interval) -> str:
    """The wording the interval supports, and no more."""
    if interval.n < 2 or np.isnan(interval.low):
        return TOO_FEW
    if interval.low > 0:
        return HIGHER
    if interval.high < 0:
        return LOWER
    if interval.low == interval.high == 0:
        return ALL_EQUAL  # the interval is the point 0: nothing to cross
    return NOT_DETECTED
