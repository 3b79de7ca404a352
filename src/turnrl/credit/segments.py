"""Vectorised group operations on dense integer codes (numpy only).

Every estimator reduces to: pick a score per row (or per trajectory), pick a
group code per row, normalise the score within its group. These helpers do the
last two steps with ``np.bincount``; no Python loop runs per row or per group.
"""

from __future__ import annotations

import numpy as np

STD_EPS = 1e-6
"""Added to the sample std before dividing (the issue's "std + 1e-6")."""


def dense_codes(*keys: np.ndarray) -> tuple[np.ndarray, int]:
    """Combine several integer code arrays into one dense code per distinct tuple.

    Rows with a negative code in any key (meaning "no group") get -1.
    Returns ``(codes, n_groups)``.
    """
    if not keys:
        raise ValueError("dense_codes needs at least one key")
    valid = np.ones(keys[0].shape[0], dtype=bool)
    for key in keys:
        valid &= key >= 0
    combined = np.zeros(keys[0].shape[0], dtype=np.int64)
    span = 1
    for key in keys:
        size = int(key.max()) + 1 if key.size else 1
        if span * size >= 2**62:
            raise OverflowError("group key space too large to combine")
        combined = combined * size + np.where(valid, key, 0)
        span *= size
    out = np.full(combined.shape[0], -1, dtype=np.int64)
    if span <= 4 * max(combined.shape[0], 1):
        # Small key space: relabel through a lookup table (no sort).
        present = np.zeros(span, dtype=bool)
        present[combined[valid]] = True
        relabel = np.cumsum(present) - 1
        out[valid] = relabel[combined[valid]]
        return out, int(present.sum())
    uniques, inverse = np.unique(combined[valid], return_inverse=True)
    out[valid] = inverse
    return out, int(uniques.shape[0])


def group_count(codes: np.ndarray, n_groups: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Members per group (rows with code -1 are ignored)."""
    valid = codes >= 0
    w = None if weights is None else weights[valid]
    return np.bincount(codes[valid], weights=w, minlength=n_groups).astype(np.float64)


def _deviation_from_mean(
    scores: np.ndarray, codes: np.ndarray, n_groups: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(score - group mean, member count per group)`` for rows with valid codes.

    The mean gets one compensation pass (the residual of the first mean is added
    back): a rounded sum can leave the mean an ulp away from the members' common
    value, and then a constant group would normalise to ~1e-10 instead of 0. After
    the pass, constant groups give exactly 0.
    """
    count = np.bincount(codes, minlength=n_groups).astype(np.float64)
    safe = np.maximum(count, 1.0)
    mean = np.bincount(codes, weights=scores, minlength=n_groups) / safe
    residual = np.bincount(codes, weights=scores - mean[codes], minlength=n_groups)
    mean += residual / safe
    return scores - mean[codes], count


def normalise_in_groups(
    scores: np.ndarray,
    codes: np.ndarray,
    n_groups: int | None = None,
    *,
    use_std: bool = True,
    eps: float = STD_EPS,
    std_floor: float = 0.0,
) -> np.ndarray:
    """``(score - group mean) / (max(sample std (ddof=1), std_floor) + eps)``; std optional.

    ``std_floor`` (default 0, i.e. plain std) keeps a group whose scores barely
    differ from turning those differences into unit-sized advantages.

    A group with one member gets 0, and so do rows with code -1 (no group).
    Constant groups give exactly 0 (see ``_deviation_from_mean``).
    """
    scores = np.asarray(scores, dtype=np.float64)
    codes = np.asarray(codes, dtype=np.int64)
    if n_groups is None:
        n_groups = int(codes.max()) + 1 if codes.size else 0
    valid = codes >= 0
    all_valid = bool(valid.all())
    c = codes if all_valid else codes[valid]
    s = scores if all_valid else scores[valid]
    deviation, count = _deviation_from_mean(s, c, n_groups)
    member_count = count[c]
    if use_std:
        squares = np.bincount(c, weights=deviation * deviation, minlength=n_groups)
        std = np.sqrt(squares / np.maximum(count - 1.0, 1.0))
        deviation /= np.maximum(std, std_floor)[c] + eps
    deviation[member_count < 2] = 0.0
    if all_valid:
        return deviation
    out = np.zeros(scores.shape[0], dtype=np.float64)
    out[valid] = deviation
    return out


def leave_one_out(scores: np.ndarray, codes: np.ndarray, n_groups: int) -> np.ndarray:
    """``score - mean of the other members of its group`` (RLOO); lone members get 0.

    Computed as ``n/(n-1) * (score - group mean)``, which is the same quantity
    (``s - (T - s)/(n-1) = (n s - T)/(n-1)``) and exactly 0 for constant groups.
    """
    scores = np.asarray(scores, dtype=np.float64)
    deviation, count = _deviation_from_mean(scores, codes, n_groups)
    n = count[codes]
    return np.where(n > 1, deviation * n / np.maximum(n - 1.0, 1.0), 0.0)
