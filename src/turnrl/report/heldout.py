"""The held-out before/after table: what a person asks of a run first.

A run logs held-out evaluations (``eval_*`` metrics, on tasks from another seed)
after the warm start (step 0) and every ``eval_every`` steps. The table compares
the first evaluation with the last one, for the headline metrics: success (overall
and per task tag), tool use, turns, return and the malformed/truncated rates.
Runs sharing a label (seeds) are summarised as mean ± std (ddof=1) across runs.

The same rows feed the terminal table ``turnrl train`` prints
(``heldout_console_table``) and the top of the HTML report.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnrl.report.runs import RunData, load_run, mean_std, numeric

EVAL_PREFIX = "eval_"
EVAL_MARKER = "eval_success"
"""A metrics row is an evaluation row when it has this key."""

_HEADLINE = (
    ("success", True),
    ("tool_rate", True),
    ("turns", False),
    ("return", False),
    ("malformed_rate", False),
    ("truncated_rate", False),
)
"""Headline metrics (without the ``eval_`` prefix) in table order, and whether their
per-tag variants (``success_hard``...) are shown too, after the overall value."""


def evaluation_rows(run: RunData) -> list[dict[str, Any]]:
    """The run's evaluation rows (those with ``eval_success``), in step order."""
    return [row for row in run.records if numeric(row.get(EVAL_MARKER)) is not None]


def headline_metrics(keys: Sequence[str]) -> list[str]:
    """The headline ``eval_*`` metrics among ``keys`` (prefix removed), in table order."""
    names = {key.removeprefix(EVAL_PREFIX) for key in keys if key.startswith(EVAL_PREFIX)}
    ordered: list[str] = []
    for base, tagged in _HEADLINE:
        if base in names:
            ordered.append(base)
        if tagged:
            ordered += sorted(n for n in names if re.fullmatch(re.escape(base) + r"_[a-z0-9]+", n))
    return ordered


@dataclass(frozen=True)
class Cell:
    """One label's value of one metric: mean, std across runs, number of runs."""

    mean: float
    std: float
    n: int

    def text(self, digits: int = 3) -> str:
        if self.n > 1:
            return f"{self.mean:.{digits}f} ± {self.std:.{digits}f}"
        return f"{self.mean:.{digits}f}"


@dataclass(frozen=True)
class HeldOutTable:
    """Per label: the steps compared and each headline metric before and after."""

    labels: list[str]
    steps: dict[str, tuple[str, str]]
    """Label -> (first evaluation step, last evaluation step), as text ("0", "60", "0-2")."""
    metrics: list[str]
    before: dict[str, dict[str, Cell]]
    """Label -> metric -> value at the first evaluation."""
    after: dict[str, dict[str, Cell]]


def _steps_text(steps: list[float]) -> str:
    low, high = int(min(steps)), int(max(steps))
    return f"{low}" if low == high else f"{low}-{high}"


def heldout_table(groups: dict[str, list[RunData]]) -> HeldOutTable | None:
    """The before/after table of labelled runs; None when no run has an evaluation.

    A run with a single evaluation (e.g. ``train.steps = 0``) shows it on both sides.
    """
    labels: list[str] = []
    steps: dict[str, tuple[str, str]] = {}
    before: dict[str, dict[str, Cell]] = {}
    after: dict[str, dict[str, Cell]] = {}
    keys: set[str] = set()
    for label, runs in groups.items():
        pairs = [(rows[0], rows[-1]) for rows in map(evaluation_rows, runs) if rows]
        if not pairs:
            continue
        labels.append(label)
        steps[label] = (
            _steps_text([float(first["step"]) for first, _ in pairs]),
            _steps_text([float(last["step"]) for _, last in pairs]),
        )
        for side, index in ((before, 0), (after, 1)):
            cells: dict[str, Cell] = {}
            names = {k for pair in pairs for k in pair[index] if k.startswith(EVAL_PREFIX)}
            for key in names:
                values = [numeric(pair[index].get(key)) for pair in pairs]
                finite = [v for v in values if v is not None and v == v]
                if finite:
                    cells[key.removeprefix(EVAL_PREFIX)] = Cell(*mean_std(finite), len(finite))
            side[label] = cells
            keys |= names
    if not labels:
        return None
    metrics = [
        m
        for m in headline_metrics(sorted(keys))
        if any(m in before[label] and m in after[label] for label in labels)
    ]
    return HeldOutTable(labels, steps, metrics, before, after)


def heldout_console_table(run_dir: str | Path) -> Any:
    """A rich Table of one run's held-out metrics after the warm start and after RL."""
    from rich.table import Table

    run = load_run(run_dir)
    table_data = heldout_table({run.label: [run]})
    if table_data is None:
        raise ValueError(f"{run_dir}: no evaluation rows in metrics.jsonl")
    first, last = table_data.steps[run.label]
    table = Table(title=f"Held-out evaluation ({Path(run_dir).name})")
    table.add_column("metric")
    table.add_column(f"warm start (step {first})", justify="right")
    table.add_column(f"after RL (step {last})", justify="right")
    for metric in table_data.metrics:
        was = table_data.before[run.label].get(metric)
        now = table_data.after[run.label].get(metric)
        table.add_row(metric, "" if was is None else was.text(), "" if now is None else now.text())
    return table
