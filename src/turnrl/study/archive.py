"""Keep a study's finished cells in the repository, and put them back.

Run directories are gitignored (checkpoints and turn records: megabytes per cell), so
a lost machine takes with it every table's source: the tables can no longer be
summarised again, and a rerun of the missing cells cannot be summarised together with
the finished ones. ``turnrl study summarise`` therefore also writes
``studies/<study>.cells.jsonl`` (committed): one line per finished cell with the
runner's record and the metrics rows the study's tables and figure read, cut to the
keys they read. ``turnrl study restore <study>`` writes those cells back as finished
run directories (``metrics.jsonl`` and the runner's marker, which names the archive)
wherever a cell's directory holds no run, so that the cells a study is missing can be
run and summarised together with the kept ones.

A restored cell has no checkpoint: it can be summarised, not resumed or continued, and
a study whose cells start from a warm start needs the warm start run again (its
directory is not archived) before any missing cell runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from turnrl.errors import InputError
from turnrl.io import atomic_write_json, atomic_write_text
from turnrl.study.declaration import DONE_FILE, Cell, Study, cells
from turnrl.study.runner import FINISHED, MISSING, cell_record, cell_state, read_metrics

ARCHIVE_DIR = "studies"


def archive_path(study: Study, root: Path) -> Path:
    return root / ARCHIVE_DIR / f"{study.name}.cells.jsonl"


def read_keys(study: Study) -> frozenset[str]:
    """Every metrics key the study's tables and figure read (and the curve's x)."""
    keys = {m.key for t in study.tables for m in (*t.metrics, *t.extra)}
    if study.curve:
        keys |= {study.curve, study.curve_x}
    return frozenset(keys)


def _cut(rows: list[dict], keys: frozenset[str], x: str) -> list[dict]:
    """The rows that hold a read key, each cut to the read keys (and ``x``)."""
    cut = []
    for row in rows:
        kept = {k: row[k] for k in row if k in keys or k == x}
        if any(k in keys and k != x for k in kept):
            cut.append(kept)
    return cut


def read_archive(study: Study, root: Path) -> dict[str, dict]:
    """The archived cells by key (empty when there is no archive). A malformed line is an
    error naming the file, line and field: the archive is the only copy."""
    path = archive_path(study, root)
    if not path.exists():
        return {}
    kept: dict[str, dict] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(str(path), number, None, f"not JSON ({exc.msg})") from None
        for field, kind in (("cell", str), ("record", dict), ("rows", list)):
            if not isinstance(entry.get(field), kind):
                raise InputError(str(path), number, field, f"must be a {kind.__name__}")
        kept[entry["cell"]] = entry
    return kept


def write_archive(study: Study, root: Path) -> Path:
    """Archive every finished cell of the run directories, keeping the archived cells
    that have no run directory here (a partial rerun adds to the archive, never shrinks
    it) and, unchanged, those restored from it (a restored run's record names the
    archive, which is not where it ran). Cells are written in the declaration's order;
    returns the archive's path."""
    kept = read_archive(study, root)
    keys = read_keys(study)
    lines = []
    for cell in cells(study, root):
        if cell.is_warm_start:
            continue
        record = cell_record(cell)
        if cell.key in kept and "restored_from" in record:  # archived as it was
            entry = kept[cell.key]
        elif cell_state(cell) == FINISHED:
            entry = {
                "cell": cell.key,
                "record": record,
                "rows": _cut(read_metrics(cell), keys, study.curve_x),
            }
        elif cell.key in kept:
            entry = kept[cell.key]
        else:
            continue
        lines.append(json.dumps(entry, sort_keys=True, separators=(",", ":")))
    path = archive_path(study, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return path


def restore(study: Study, root: Path) -> list[Cell]:
    """Write the archived cells back where their run directory holds no run; returns
    the cells restored (a cell with a run here, finished or partial, is left alone)."""
    kept = read_archive(study, root)
    path = archive_path(study, root)
    restored = []
    for cell in cells(study, root):
        entry = kept.get(cell.key)
        if entry is None or cell.is_warm_start or cell_state(cell) != MISSING:
            continue
        cell.run_dir.mkdir(parents=True, exist_ok=True)
        rows = "".join(json.dumps(row) + "\n" for row in entry["rows"])
        atomic_write_text(cell.run_dir / "metrics.jsonl", rows)
        record = {**entry["record"], "restored_from": str(path.relative_to(root))}
        atomic_write_json(cell.run_dir / DONE_FILE, record)
        restored.append(cell)
    return restored
