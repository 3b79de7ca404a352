"""How good a fitted Q is: rank correlation, calibration, loss, within-state ranking.

Numpy only, on predictions and targets (the Q itself is in
:mod:`turnrl.train.iterate.qmodel`). Calibration uses equal-count bins of the
prediction (reliability table and ECE = sum over bins of
``n_b / n * |mean prediction - mean target|``), which works for probabilities
and for unbounded returns alike. Rank correlation is Spearman's (average ranks
for ties), computed with numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their average rank (as ``scipy.stats.rankdata``)."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    # start index of each run of equal values
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], len(values)]
    mean_rank = (starts + ends + 1) / 2.0  # mean of 1-based ranks start+1..end
    ranks = np.empty(len(values))
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation; NaN when either side is constant or has < 2 values."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    if a.size < 2:
        return math.nan
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / denom) if denom > 0 else math.nan


def reliability(pred: np.ndarray, target: np.ndarray, bins: int) -> list[dict[str, float]]:
    """Equal-count bins of the prediction: mean prediction, mean target and count each."""
    pred, target = np.asarray(pred, dtype=np.float64), np.asarray(target, dtype=np.float64)
    if pred.size == 0:
        return []
    order = np.argsort(pred, kind="mergesort")
    out = []
    for chunk in np.array_split(order, min(bins, pred.size)):
        out.append(
            {
                "pred_mean": float(pred[chunk].mean()),
                "target_mean": float(target[chunk].mean()),
                "count": float(chunk.size),
            }
        )
    return out


def expected_calibration_error(table: Sequence[dict[str, float]]) -> float:
    """``sum_b n_b / n * |mean prediction_b - mean target_b|`` over a reliability table."""
    total = sum(row["count"] for row in table)
    if total == 0:
        return math.nan
    return float(
        sum(row["count"] / total * abs(row["pred_mean"] - row["target_mean"]) for row in table)
    )


def prediction_loss(pred: np.ndarray, target: np.ndarray, loss: str) -> float:
    """MSE, or log-loss of probabilities (clipped away from 0 and 1)."""
    pred, target = np.asarray(pred, dtype=np.float64), np.asarray(target, dtype=np.float64)
    if pred.size == 0:
        return math.nan
    if loss == "mse":
        return float(np.mean((pred - target) ** 2))
    p = np.clip(pred, 1e-7, 1 - 1e-7)
    return float(-np.mean(target * np.log(p) + (1 - target) * np.log(1 - p)))


def within_state(
    pred: np.ndarray, target: np.ndarray, states: Sequence[str]
) -> tuple[float, float, int]:
    """How well Q ranks responses to the SAME state, which is all the ``q`` estimator uses.

    Prediction and return are centred within each state that has two or more
    logged responses; returns ``(pearson, spearman, rows)`` over those rows
    (NaN, NaN, 0 when there are none or nothing varies).
    """
    codes = {key: i for i, key in enumerate(dict.fromkeys(states))}
    code = np.array([codes[k] for k in states], dtype=np.int64)
    count = np.bincount(code, minlength=len(codes))
    keep = count[code] >= 2
    if not keep.any():
        return math.nan, math.nan, 0

    def centred(values: np.ndarray) -> np.ndarray:
        means = np.bincount(code, weights=values, minlength=len(codes)) / np.maximum(count, 1)
        return (values - means[code])[keep]

    p, t = centred(np.asarray(pred, float)), centred(np.asarray(target, float))
    pearson = math.nan
    if p.std() > 1e-12 and t.std() > 1e-12:
        pearson = float(np.corrcoef(p, t)[0, 1])
    return pearson, spearman(p, t), int(keep.sum())


def q_quality(
    pred: np.ndarray,
    target: np.ndarray,
    *,
    loss: str,
    baseline: float,
    bins: int = 10,
    states: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Quality of Q predictions against returns.

    ``loss`` (MSE or log-loss), ``baseline_loss`` (the same loss of the constant
    ``baseline``, the training mean: Q is useful only if it beats this),
    ``ece``, ``spearman``, ``pearson``, ``n`` and the ``reliability`` table; with
    ``states``, also ``within_state_pearson``/``within_state_spearman``/
    ``within_state_n`` (see :func:`within_state`).
    """
    pred, target = np.asarray(pred, dtype=np.float64), np.asarray(target, dtype=np.float64)
    table = reliability(pred, target, bins)
    pearson = math.nan
    if pred.size >= 2 and pred.std() > 0 and target.std() > 0:
        pearson = float(np.corrcoef(pred, target)[0, 1])
    out: dict[str, Any] = {
        "loss": prediction_loss(pred, target, loss),
        "baseline_loss": prediction_loss(np.full_like(target, baseline), target, loss),
        "ece": expected_calibration_error(table),
        "spearman": spearman(pred, target),
        "pearson": pearson,
        "n": int(pred.size),
        "reliability": table,
    }
    if states is not None:
        w_pearson, w_spearman, w_n = within_state(pred, target, states)
        out.update(
            within_state_pearson=w_pearson, within_state_spearman=w_spearman, within_state_n=w_n
        )
    return out
