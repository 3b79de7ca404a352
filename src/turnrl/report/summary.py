"""Final metric values of runs and of labels (seed groups), as plain dicts for tables."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from turnrl.report.runs import (
    RunData,
    all_metrics,
    final_value,
    group_by_label,
    load_runs,
    mean_std,
)

LabelFinals = dict[str, dict[str, tuple[float, float, int]]]


def run_finals(runs: Sequence[RunData], last: int = 1) -> dict[str, dict[str, float]]:
    """``{run name: {metric: final value}}`` for loaded runs (see ``summary``)."""
    metrics = all_metrics(runs)
    result: dict[str, dict[str, float]] = {}
    for run in runs:
        finals = {key: final_value(run, key, last) for key in metrics}
        result[run.name] = {key: value for key, value in finals.items() if value is not None}
    return result


def label_finals(runs: Sequence[RunData], last: int = 1) -> LabelFinals:
    """``{label: {metric: (mean, std, n_runs)}}`` for loaded runs (see ``label_summary``)."""
    metrics = all_metrics(runs)
    result: LabelFinals = {}
    for label, group in group_by_label(runs).items():
        entry: dict[str, tuple[float, float, int]] = {}
        for key in metrics:
            finals = [v for v in (final_value(run, key, last) for run in group) if v is not None]
            if finals:
                entry[key] = (*mean_std(finals), len(finals))
        result[label] = entry
    return result


def summary(run_dirs: Iterable[str | Path], last: int = 1) -> dict[str, dict[str, float]]:
    """Final metrics of each run: ``{run name: {metric: value}}``, metrics in curated
    order. A metric a run never logged is absent from its dict. ``last`` > 1 averages
    the final ``last`` logged values (steadier for noisy per-step metrics)."""
    return run_finals(load_runs(run_dirs), last)


def label_summary(run_dirs: Iterable[str | Path], last: int = 1) -> LabelFinals:
    """Final metrics per label across seeds: ``{label: {metric: (mean, std, n)}}``,
    std with ddof=1, ``n`` the number of the label's runs that logged the metric."""
    return label_finals(load_runs(run_dirs), last)
