"""Reading run directories for reports: metrics, config copy, label, final values.

A run directory holds ``metrics.jsonl`` (one JSON object per training step, written with
``turnrl.io.append_jsonl``) and, optionally, a copy of its config as ``config.toml``
(or ``config.json``). Metric keys are treated generically: every numeric key except
``step`` is a metric; known keys come first, in a curated order (``metric_order``).

When a resumed run logged a step twice, the later record wins (the earlier one belongs
to the attempt that crashed after its last checkpoint).
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turnrl.errors import InputError
from turnrl.io import read_jsonl_tolerant

METRICS_FILE = "metrics.jsonl"
CONFIG_FILES = ("config.toml", "config.json")
STEP_KEY = "step"

# Known metrics, most important first; a trailing ``*`` matches any suffix (turn index...).
_CURATED = (
    "success",
    "success_hard",
    "success_easy",
    "eval_success",
    "eval_success_hard",
    "eval_success_easy",
    "eval_*",
    "tool_rate_hard",
    "tool_rate_easy",
    "tool_rate*",
    "turns",
    "reward*",
    "adv_mean_turn*",
    "adv_std_turn*",
    "adv_*",
    "zero_adv_group_frac",
    "loss",
    "pg_loss",
    "kl",
    "kl_*",
    "clip_frac*",
    "approx_kl_old",
    "ratio_mean",
    "entropy",
    "grad_norm",
    "lr",
    "env_steps",
    "tokens",
)


@dataclass
class RunData:
    """One run directory, loaded."""

    path: Path
    name: str
    """Display name of this run (directory name, made unique among the loaded runs)."""
    label: str
    """Group name: the config's ``label``, else the directory name. Runs sharing a
    label are seeds of one method."""
    records: list[dict[str, Any]]
    """Metric records sorted by step, one per step."""
    config: dict[str, Any] | None = None
    config_text: str | None = None
    series_cache: dict[str, tuple[list[float], list[float]]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def series(self, key: str) -> tuple[list[float], list[float]]:
        """``(steps, values)`` of a metric over the records that have a numeric value."""
        if key not in self.series_cache:
            steps, values = [], []
            for record in self.records:
                value = numeric(record.get(key))
                if value is not None:
                    steps.append(float(record[STEP_KEY]))
                    values.append(value)
            self.series_cache[key] = (steps, values)
        return self.series_cache[key]

    def metrics(self) -> set[str]:
        """Names of the numeric metrics present in at least one record."""
        return {
            key
            for record in self.records
            for key, value in record.items()
            if key != STEP_KEY and numeric(value) is not None
        }


def numeric(value: Any) -> float | None:
    """``value`` as a float if it is a number or bool (inf becomes NaN), else None."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        number = float(value)
        return number if math.isfinite(number) else math.nan
    return None


def _read_config(run_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    for name in CONFIG_FILES:
        path = run_dir / name
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        try:
            data = tomllib.loads(text) if name.endswith(".toml") else json.loads(text)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
            raise InputError(str(path), None, None, f"cannot parse config copy: {err}") from None
        return (data if isinstance(data, dict) else None), text
    return None, None


def _records_by_step(records: list[Any], source: Path) -> list[dict[str, Any]]:
    by_step: dict[float, dict[str, Any]] = {}
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise InputError(str(source), None, None, f"record {index + 1} is not a JSON object")
        step = numeric(record.get(STEP_KEY))
        if step is None or math.isnan(step):
            step = float(index)  # no step key: use the record's position
            record = {**record, STEP_KEY: step}
        by_step[step] = record
    return [by_step[step] for step in sorted(by_step)]


def load_run(run_dir: str | Path) -> RunData:
    """Load a run directory (its ``metrics.jsonl`` must exist; a crash-truncated last
    line is skipped). A directory that is not a run, or a damaged metrics or config
    file, is an :class:`~turnrl.errors.InputError` naming the file (and line)."""
    path = Path(run_dir)
    metrics_path = path / METRICS_FILE
    if not metrics_path.is_file():
        raise InputError(
            str(metrics_path), None, None, f"no metrics file (is {path} a run directory?)"
        )
    records = _records_by_step(read_jsonl_tolerant(metrics_path), metrics_path)
    config, config_text = _read_config(path)
    label = config.get("label") if config else None
    name = path.resolve().name
    return RunData(
        path=path,
        name=name,
        label=str(label) if label else name,
        records=records,
        config=config,
        config_text=config_text,
    )


def load_runs(run_dirs: Iterable[str | Path]) -> list[RunData]:
    """Load several runs; display names are made unique by adding parent folders."""
    runs = [load_run(run_dir) for run_dir in run_dirs]
    depth = 1
    while len({run.name for run in runs}) < len(runs) and depth < 6:
        depth += 1
        for run in runs:
            run.name = "/".join(run.path.resolve().parts[-depth:])
    return runs


def group_by_label(runs: Sequence[RunData]) -> dict[str, list[RunData]]:
    """Runs grouped by label, groups in order of first appearance."""
    groups: dict[str, list[RunData]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    return groups


def _natural_key(text: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _rank(key: str) -> int:
    for rank, pattern in enumerate(_CURATED):
        if key == pattern or (pattern.endswith("*") and key.startswith(pattern[:-1])):
            return rank
    return len(_CURATED)


def metric_order(keys: Iterable[str]) -> list[str]:
    """Curated order for known metrics (``adv_mean_turn2`` before ``adv_mean_turn10``),
    then the others alphabetically."""
    return sorted(set(keys), key=lambda key: (_rank(key), _natural_key(key)))


def all_metrics(runs: Sequence[RunData]) -> list[str]:
    """Every metric present in any run, in ``metric_order``."""
    return metric_order(key for run in runs for key in run.metrics())


def final_value(run: RunData, key: str, last: int = 1) -> float | None:
    """Mean of the last ``last`` non-NaN values of a metric (None if it never appears)."""
    _, values = run.series(key)
    finite = [value for value in values if not math.isnan(value)]
    if not finite:
        return None
    tail = finite[-last:]
    return sum(tail) / len(tail)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
