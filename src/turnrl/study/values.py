"""Numbers read from finished cells: one metric reduced per cell, and curves."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from turnrl.errors import UsageError
from turnrl.study.declaration import Cell, Metric


def reduce(rows: Sequence[dict], metric: Metric) -> float:
    """``metric`` of one run's metrics rows (``nan`` when the run never logged it)."""
    values = [float(row[metric.key]) for row in rows if metric.key in row]
    if not values:
        return float("nan")
    if metric.reduce == "last":
        return values[-1]
    if metric.reduce == "first":
        return values[0]
    if metric.reduce == "min_after_first":
        return min(values[1:]) if len(values) > 1 else float("nan")
    if metric.reduce == "mean":
        return float(np.mean(values))
    if metric.reduce == "mean_after_first":
        return float(np.mean(values[1:])) if len(values) > 1 else float("nan")
    end, _, count = metric.reduce.partition(":")
    if end in ("first", "last") and count.isdigit() and int(count) > 0:
        window = values[: int(count)] if end == "first" else values[-int(count) :]
        return float(np.mean(window))
    raise UsageError(f"metric {metric.key!r}: unknown reduce {metric.reduce!r}")


def curve(rows: Sequence[dict], key: str, x: str) -> tuple[list[float], list[float]]:
    """(x, value) at every row that logged ``key``; rows without ``x`` are skipped."""
    pairs = [(float(row[x]), float(row[key])) for row in rows if key in row and x in row]
    return [p for p, _ in pairs], [v for _, v in pairs]


def pair_key(cell: Cell) -> tuple[int, int]:
    """What pairs runs across arms: the warm start and the seed."""
    return (cell.warm, cell.seed)
