"""``turnrl study power``: what a study's design can detect, from a pilot's variance.

A study declares its outcome (``Study.outcome``: a metric of its first paired table,
by default that table's first metric) and its units (warm starts when several share
the seeds, seeds otherwise: :func:`turnrl.study.statistics.units`). The pilot is the
archived cells of ``Study.pilot`` (default: the study's own archive,
``studies/<study>.cells.jsonl``). For every comparison of the paired table (arm −
baseline, per setting) the pilot's unit-level differences give the standard deviation;
from it, the minimum detectable effect at 80% power, alpha 0.05, two-sided paired t
with the study's declared number of units, and the units a given effect needs.

The pilot's sd is itself an estimate from few units (with 3 units it can be half or
twice the true one): the numbers say the scale of what a design can show, not a
guarantee.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from turnrl.errors import UsageError
from turnrl.study import archive, statistics
from turnrl.study.declaration import Cell, Metric, Study, Table, cells
from turnrl.study.runner import FINISHED, cell_state, read_metrics
from turnrl.study.values import pair_key, reduce


def design_units(study: Study) -> tuple[int, str]:
    """How many units the declared study has, and what they are."""
    warm = study.warm_starts
    if warm is not None and not warm.per_seed and warm.count > 1 and len(study.seeds) > 1:
        return warm.count, "warm start"
    return len(study.seeds), "seed"


def outcome(study: Study) -> tuple[Table, Metric]:
    """The study's paired table and its declared outcome metric."""
    paired = next((t for t in study.tables if t.kind == "paired"), None)
    if paired is None:
        raise UsageError(f"study {study.name!r}: no paired table, so no comparison to power")
    if not study.outcome:
        return paired, paired.metrics[0]
    for metric in paired.metrics:
        if metric.key == study.outcome:
            return paired, metric
    raise UsageError(
        f"study {study.name!r}: outcome {study.outcome!r} is not a metric of its paired table"
    )


@dataclass(frozen=True)
class Comparison:
    """One comparison's pilot and what the design can detect."""

    setting: str
    arm: str
    baseline: str
    pilot_units: int
    unit: str
    sd: float
    mde: float
    needed: int | None
    """Units needed for the asked effect (None when none was asked or the pilot's sd is
    not > 0)."""


def _pilot_rows(pilot: Study, root: Path) -> dict[str, list[dict]]:
    """Rows of every pilot cell: the archive's, or a finished run's here."""
    kept = {key: entry["rows"] for key, entry in archive.read_archive(pilot, root).items()}
    for cell in cells(pilot, root):
        if not cell.is_warm_start and cell.key not in kept and cell_state(cell) == FINISHED:
            kept[cell.key] = read_metrics(cell)
    return kept


def comparisons(
    study: Study, pilot: Study, root: Path, effect: float | None = None
) -> list[Comparison]:
    """Every arm − baseline comparison of ``study``'s paired table, powered from the
    pilot's cells of the same setting and arms (those the pilot has)."""
    table, metric = outcome(study)
    baseline = table.baseline or study.baseline
    rows = _pilot_rows(pilot, root)
    n, _unit = design_units(study)
    values: dict[tuple[str, str], dict[tuple[int, int], float]] = {}
    pilot_cells: list[Cell] = [c for c in cells(pilot, root) if c.key in rows]
    for cell in pilot_cells:
        values.setdefault((cell.setting, cell.arm), {})[pair_key(cell)] = reduce(
            rows[cell.key], metric
        )
    out = []
    arms = [a.name for a in study.arms if not table.arms or a.name in table.arms]
    for setting in study.settings:
        base = values.get((setting.name, baseline or ""), {})
        for arm in arms:
            if arm == baseline or (setting.name, arm) not in values:
                continue
            diffs = statistics.paired_differences(values[setting.name, arm], base)
            unit_values, unit = statistics.units(diffs)
            _mean, sd = statistics.mean_sd(list(unit_values))
            out.append(
                Comparison(
                    setting.name,
                    arm,
                    baseline or "",
                    len(unit_values),
                    unit,
                    sd,
                    statistics.minimum_detectable_effect(sd, n),
                    None if effect is None or not sd > 0 else statistics.units_needed(effect, sd),
                )
            )
    return out


def report(study: Study, pilot: Study, root: Path, effect: float | None = None) -> str:
    """The text ``turnrl study power`` prints."""
    _table, metric = outcome(study)
    n, unit = design_units(study)
    found = comparisons(study, pilot, root, effect)
    lines = [
        f"{study.name}: outcome {metric.label!r} ({metric.key}, {metric.reduce}); design "
        f"n = {n} {unit}s; two-sided paired t, alpha {statistics.ALPHA}, "
        f"power {statistics.POWER:.0%}",
        f"pilot: {pilot.name} ({archive.archive_path(pilot, root).relative_to(root)} and "
        "finished runs here); sd: of the pilot's unit-level differences (ddof = 1)",
    ]
    if n < statistics.SIGN_FLIP_MIN_N:
        lines.append(
            f"n = {n} < {statistics.SIGN_FLIP_MIN_N}: the sign-flip test cannot reach p < "
            f"0.05 (smallest p {2.0 ** (1 - n):.3g}); “detected” rests on the t-test alone"
        )
    if not found:
        lines.append("no pilot cells for any comparison: run the pilot, or declare one")
        return "\n".join(lines)
    header = ["setting", "comparison", "pilot n", "pilot sd", f"MDE at n = {n}"]
    if effect is not None:
        header.append(f"n for effect {effect:g}")
    body = []
    for c in found:
        row = [
            c.setting or "–",
            f"{c.arm} − {c.baseline}",
            statistics.units_text(c.pilot_units, c.unit),
        ]
        row += [_num(c.sd, metric.digits + 1), _num(c.mde, metric.digits + 1)]
        if effect is not None:
            needed = "–" if c.needed is None else str(c.needed)
            row.append("> 10000" if c.needed is not None and c.needed > 10_000 else needed)
        body.append(row)
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    for row in [header, *body]:
        lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    return "\n".join(lines)


def _num(value: float, digits: int) -> str:
    return "–" if value != value else f"{value:.{digits}f}"
