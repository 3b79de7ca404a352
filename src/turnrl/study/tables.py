"""Markdown tables of a study's finished cells: per seed, per arm, paired.

Every table shows the per-seed values it summarises; means come with the sample
standard deviation (``ddof = 1``, written "sd"); comparisons are paired
differences with a paired t-interval, t and sign-flip p and the verdict of
:mod:`turnrl.study.statistics`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from turnrl.study import statistics
from turnrl.study.declaration import Cell, Metric, Study, Table
from turnrl.study.values import pair_key, reduce

Rows = Callable[[Cell], list[dict]]


def number(value: float, digits: int, sign: bool = False) -> str:
    if np.isnan(value):
        return "–"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def mean_sd_text(values: Sequence[float], digits: int, sign: bool = False) -> str:
    mean, sd = statistics.mean_sd(values)
    return f"{number(mean, digits, sign)} ± {number(sd, digits)}"


def _has_start(metric: Metric) -> bool:
    """Whether ``metric`` is a run's end, shown with its start and change."""
    return metric.reduce == "last" or metric.reduce.startswith("last:")


def _start(metric: Metric) -> Metric:
    """The start of a run for ``metric``: its first value (the mean of the first N for a
    mean of the last N)."""
    window = metric.reduce.partition(":")[2] if metric.reduce.startswith("last:") else ""
    return Metric(metric.key, metric.label, f"first:{window}" if window else "first", metric.digits)


def _groups(study: Study, finished: Sequence[Cell]) -> list[tuple[str, str, list[Cell]]]:
    """(setting, arm, cells in pair order) for every setting and arm with a finished cell."""
    out = []
    for setting in study.settings:
        for arm in study.arms:
            group = [c for c in finished if c.setting == setting.name and c.arm == arm.name]
            if group:
                out.append((setting.name, arm.name, sorted(group, key=pair_key)))
    return out


def _row_label(study: Study, setting: str, arm: str) -> list[str]:
    return ([setting] if len(study.settings) > 1 else []) + [arm]


def _label_headers(study: Study) -> list[str]:
    return (["setting"] if len(study.settings) > 1 else []) + ["arm"]


def _markdown(header: list[str], rows: list[list[str]], right_from: int) -> str:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def seeds_table(study: Study, table: Table, finished: Sequence[Cell], rows: Rows) -> str:
    """One row per cell: start -> end of each metric, then the extra metrics (no arm
    column for a one-arm study, no warm-start column unless warm starts are shared)."""
    warm = study.warm_starts is not None and not study.warm_starts.per_seed
    labels = len(study.arms) > 1 or len(study.settings) > 1
    header = (_label_headers(study) if labels else []) + (["warm start"] if warm else [])
    header.append("seed")
    left = len(header)
    header += [f"{m.label} start → end" for m in table.metrics] + [m.label for m in table.extra]
    body = []
    for setting, arm, group in _groups(study, finished):
        for cell in group:
            log = rows(cell)
            line = (_row_label(study, setting, arm) if labels else []) + (
                [str(cell.warm)] if warm else []
            )
            line.append(str(cell.seed))
            for m in table.metrics:
                start, end = reduce(log, _start(m)), reduce(log, m)
                line.append(f"{number(start, m.digits)} → {number(end, m.digits)}")
            line += [number(reduce(log, m), m.digits) for m in table.extra]
            body.append(line)
    return _markdown(header, body, left)


def arms_table(study: Study, table: Table, finished: Sequence[Cell], rows: Rows) -> str:
    """Per arm: seeds, then per metric the start mean, end mean ± sd, change mean ± sd
    and the end value of every seed."""
    header = [*_label_headers(study), "n"]
    left = len(header)
    for m in table.metrics:
        if _has_start(m):
            header += [f"{m.label}: start (mean)", "end (mean ± sd)", "change (mean ± sd)"]
            header.append("end per seed")
        else:  # a summary of the whole run: no start and change
            header += [f"{m.label} (mean ± sd)", "per seed"]
    body = []
    for setting, arm, group in _groups(study, finished):
        line = [*_row_label(study, setting, arm), str(len(group))]
        for m in table.metrics:
            end = [reduce(rows(c), m) for c in group]
            if _has_start(m):
                start = [reduce(rows(c), _start(m)) for c in group]
                change = [e - s for s, e in zip(start, end, strict=True)]
                line += [
                    number(float(np.mean(start)), m.digits),
                    mean_sd_text(end, m.digits),
                    mean_sd_text(change, m.digits, sign=True),
                ]
            else:
                line.append(mean_sd_text(end, m.digits))
            line.append(", ".join(number(v, m.digits) for v in end))
        body.append(line)
    return _markdown(header, body, left)


def _test_cells(test: statistics.Test, digits: int) -> list[str]:
    """Mean, 95% t-interval, t p and sign-flip p of one test, as table cells."""
    ci = f"[{number(test.low, digits, True)}, {number(test.high, digits, True)}]"
    p_t, p_flip = statistics.p_text(test.t_p), statistics.p_text(test.sign_flip_p)
    return [number(test.mean, digits, True), ci, p_t, p_flip]


def paired_table(study: Study, table: Table, finished: Sequence[Cell], rows: Rows) -> str:
    """Per arm other than the baseline: ``arm - baseline`` of each metric, pair by pair
    (paired by warm start and seed, never by position), the unit's mean, 95% paired
    t-interval, t and sign-flip p and the verdict; with warm starts as the unit, the
    seed-level interval and p beside."""
    baseline = table.baseline or study.baseline
    if baseline is None:
        raise ValueError(f"study {study.name!r}: a paired table needs a baseline arm")
    groups = _groups(study, finished)
    lines = []
    for setting, arm, group in groups:
        if arm == baseline:
            continue
        base = next((g for s, a, g in groups if s == setting and a == baseline), [])
        for m in table.metrics:
            ours = {pair_key(c): reduce(rows(c), m) for c in group}
            theirs = {pair_key(c): reduce(rows(c), m) for c in base}
            diffs = statistics.paired_differences(ours, theirs)
            lines.append((setting, arm, m, diffs, statistics.paired_test(diffs)))
    seed_level = any(test.seed_level is not None for *_, test in lines)
    header = [*_label_headers(study), "metric", "n", "difference per pair", "mean"]
    header += ["95% t-CI", "p (t)", "p (sign-flip)", "verdict"]
    if seed_level:
        header.append("seed level, not the unit (pairs, mean, 95% t-CI, p (t))")
    left = len(_label_headers(study)) + 1
    body = []
    for setting, arm, m, diffs, test in lines:
        line = [*_row_label(study, setting, f"{arm} − {baseline}"), m.label]
        line.append(statistics.units_text(test.n, test.unit))
        line.append(", ".join(number(v, m.digits, True) for v in diffs.values()))
        line += [*_test_cells(test, m.digits), statistics.verdict(test)]
        if seed_level:
            seeds = test.seed_level
            line.append(
                "–"
                if seeds is None
                else f"{seeds.n}: " + ", ".join(_test_cells(seeds, m.digits)[:3])
            )
        body.append(line)
    return _markdown(header, body, left)


BUILDERS = {"seeds": seeds_table, "arms": arms_table, "paired": paired_table}


def table_note(study: Study, table: Table) -> str:
    """The line under a table saying what its numbers are."""
    if table.kind == "seeds":
        if all(m.key.startswith("eval_") for m in table.metrics):
            return "Start: the first evaluation (after the warm start); end: the last."
        return "Start: the first value each run logged (not all at the same step); end: the last."
    if table.kind == "arms":
        return "Means over seeds; sd: sample standard deviation (ddof = 1)."
    warm = study.warm_starts
    if warm is None:
        unit = "the unit is the seed; each run trains its own warm start"
    elif warm.per_seed:
        unit = "the unit is the seed; each seed has its own warm start"
    elif warm.count > 1:
        unit = (
            "the unit is the warm start: the mean of its seeds' differences first (its "
            "seeds are not independent); the seed level is shown beside, not the verdict's"
        )
    else:
        unit = "the unit is the seed; one warm start shared by all: RL spread only"
    return (
        f"Differences pair by pair (same warm start and seed); {unit}. 95% paired "
        "t-interval of the units' mean, two-sided paired t p and exact sign-flip p (all "
        "2^n sign patterns). “Detected” only where the t-interval excludes 0 and p (t) < "
        f"0.05 and, from n = {statistics.SIGN_FLIP_MIN_N} units, p (sign-flip) < 0.05 as "
        "well; below that the sign-flip test cannot reach 0.05 (its smallest p is "
        "2^(1-n)) and the verdict rests on the t-test alone. “Not detected” is not "
        "evidence of no difference (`turnrl study power` gives the effect this design "
        "could detect)."
    )


def build(study: Study, table: Table, finished: Sequence[Cell], rows: Rows) -> str:
    if table.kind not in BUILDERS:
        raise ValueError(f"study {study.name!r}, table {table.name!r}: unknown kind {table.kind!r}")
    if table.arms:
        finished = [c for c in finished if c.arm in table.arms]
    return BUILDERS[table.kind](study, table, finished, rows) + "\n\n" + table_note(study, table)
