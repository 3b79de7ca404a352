"""Run what a study is missing: one process per cell, ``jobs`` at a time.

A cell's state is read from its run directory only, so a killed study (or a killed
machine) resumes by running the same command again:

- finished: ``study-cell.json`` is there (written atomically after the command
  exited 0) -- never run again;
- partial: the directory holds a run (``config.toml``) but no marker -- the
  command is run again with the study's resume flag (``turnrl train --resume``
  continues from the last checkpoint);
- missing: nothing there -- the command is run.

Warm-start cells run before the cells that start from them. Each cell's output
goes to ``runs/studies/<study>/logs/<cell>.log`` (not into its run directory,
which ``turnrl train`` wants empty or holding its run). Every child gets
``OMP_NUM_THREADS=1`` unless the environment already sets it: one process per core.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from turnrl.errors import InputError
from turnrl.io import atomic_write_json, read_jsonl_tolerant
from turnrl.study.declaration import DONE_FILE, Cell, Study, cells, study_dir
from turnrl.study.provenance import git_commit

FINISHED, PARTIAL, MISSING = "finished", "partial", "missing"


def cell_state(cell: Cell) -> str:
    if (cell.run_dir / DONE_FILE).exists():
        return FINISHED
    if (cell.run_dir / "config.toml").exists():
        return PARTIAL
    return MISSING


def cell_record(cell: Cell) -> dict:
    """What the runner wrote when the cell finished (empty when it has not)."""
    path = cell.run_dir / DONE_FILE
    if not path.exists():
        return {}
    redo = "delete it to run the cell again"
    try:
        record = json.loads(path.read_bytes())
    except json.JSONDecodeError as err:  # cut short by a full disk, a copy, a crash
        raise InputError(str(path), err.lineno, None, f"damaged JSON ({err.msg}); {redo}") from None
    except UnicodeDecodeError:
        raise InputError(str(path), None, None, f"damaged: not UTF-8 text; {redo}") from None
    if not isinstance(record, dict):
        raise InputError(str(path), 1, None, f"damaged: not a JSON object; {redo}")
    return record


def cell_seconds(cell: Cell) -> float | None:
    """Measured wall seconds of a finished cell (``None`` if it has not finished)."""
    seconds = cell_record(cell).get("seconds")
    return None if seconds is None else float(seconds)


def select(all_cells: Sequence[Cell], only: Sequence[str]) -> list[Cell]:
    """The cells whose key contains every ``only`` fragment (all cells without one).
    Warm starts that a selected cell needs are kept."""
    if not only:
        return list(all_cells)
    chosen = [c for c in all_cells if all(part in c.key for part in only)]
    warms = {c.warm_from for c in chosen if not c.is_warm_start}
    needed = [c for c in all_cells if c.is_warm_start and c.key in warms and c not in chosen]
    return needed + chosen


@dataclass
class Outcome:
    cell: Cell
    returncode: int
    seconds: float


def command_for(cell: Cell, study: Study) -> list[str]:
    argv = list(cell.argv)
    if cell_state(cell) == PARTIAL and study.resume_flag:
        argv.insert(_option_position(argv), study.resume_flag)
    return argv


def _option_position(argv: list[str]) -> int:
    """Where to put a flag: before ``--config`` (after the program and subcommand)."""
    return argv.index("--config") if "--config" in argv else len(argv)


def log_path(cell: Cell, study: Study, root: Path) -> Path:
    return study_dir(study, root) / "logs" / (cell.key.replace("/", "__") + ".log")


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_study(
    study: Study,
    root: Path,
    *,
    jobs: int = 1,
    only: Sequence[str] = (),
    on_event: Callable[[str, Cell, Outcome | None], None] | None = None,
) -> list[Outcome]:
    """Run every selected cell that is not finished, ``jobs`` processes at a time
    (warm starts first). Returns the outcome of each cell run; failed cells are
    reported, not retried, and do not stop the others.

    SIGTERM or SIGINT (in the main thread) raises
    :class:`~turnrl.train.stop_signals.RunInterrupted`: the running cells are
    terminated and waited for, and every process they started (an agent's MCP
    server, say) is killed on the way out, so a stopped study leaves nothing running;
    its cells are then partial and resume on the next run."""
    from turnrl.train.stop_signals import stopping_on_signals

    todo = pending_cells(study, root, only)
    phases = [[c for c in todo if c.is_warm_start], [c for c in todo if not c.is_warm_start]]
    outcomes: list[Outcome] = []
    with stopping_on_signals():
        for phase in phases:
            outcomes += _run_phase(study, root, phase, max(1, jobs), on_event or _quiet)
            failed = {o.cell.key for o in outcomes if o.returncode and o.cell.is_warm_start}
            if failed:
                phases[1] = [c for c in phases[1] if c.warm_from not in failed]
    return outcomes


def pending_cells(study: Study, root: Path, only: Sequence[str] = ()) -> list[Cell]:
    """The selected cells that are not finished, once the restored warm starts they
    need are made missing again (:func:`_clear_restored_warm_starts`)."""
    selected = select(cells(study, root), only)
    _clear_restored_warm_starts(selected)
    return [c for c in selected if cell_state(c) != FINISHED]


def _clear_restored_warm_starts(selected: Sequence[Cell]) -> None:
    """Make missing again each warm start that a cell still to run starts from but that
    was restored from an archive (``turnrl study restore``): a restored cell has its
    metrics and marker, not its checkpoint. Only a study that starts from another
    study's cells meets one (a study's own warm starts are never archived); the files
    removed are the two the restore wrote, and the archive still holds them."""
    needed = {c.warm_from for c in selected if not c.is_warm_start and cell_state(c) != FINISHED}
    for cell in selected:
        if cell.is_warm_start and cell.key in needed and "restored_from" in cell_record(cell):
            for name in (DONE_FILE, "metrics.jsonl"):
                (cell.run_dir / name).unlink(missing_ok=True)
            if not any(cell.run_dir.iterdir()):
                cell.run_dir.rmdir()


def _quiet(event: str, cell: Cell, outcome: Outcome | None) -> None:
    del event, cell, outcome


def _run_phase(
    study: Study,
    root: Path,
    todo: list[Cell],
    jobs: int,
    on_event: Callable[[str, Cell, Outcome | None], None],
) -> list[Outcome]:
    pending = list(todo)
    running: list[tuple[Cell, subprocess.Popen, float, object, str]] = []
    outcomes: list[Outcome] = []
    try:
        while pending or running:
            while pending and len(running) < jobs:
                cell = pending.pop(0)
                argv = command_for(cell, study)
                log = log_path(cell, study, root)
                log.parent.mkdir(parents=True, exist_ok=True)
                handle = log.open("ab")
                handle.write(f"$ {' '.join(argv)}\n".encode())
                handle.flush()
                commit = git_commit(root)  # the code the cell runs, not what HEAD is later
                process = subprocess.Popen(
                    argv, cwd=root, stdout=handle, stderr=subprocess.STDOUT, env=_child_env()
                )
                running.append((cell, process, time.perf_counter(), handle, commit))
                on_event("start", cell, None)
            time.sleep(0.05)
            for item in list(running):
                cell, process, started, handle, commit = item
                if process.poll() is None:
                    continue
                running.remove(item)
                handle.close()  # type: ignore[attr-defined]
                outcome = Outcome(cell, process.returncode, time.perf_counter() - started)
                if outcome.returncode == 0:
                    _mark_finished(cell, process.args, outcome.seconds, commit)  # type: ignore[arg-type]
                outcomes.append(outcome)
                on_event("end", cell, outcome)
    finally:
        for _cell, process, _, handle, _commit in running:  # interrupted: leave no orphan behind
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:  # a cell that ignores SIGTERM
                process.kill()
                process.wait()
            handle.close()  # type: ignore[attr-defined]
    return outcomes


def _mark_finished(cell: Cell, argv: list[str], seconds: float, commit: str) -> None:
    """The cell's record: its command, time, the commit it was started at, machine."""
    from turnrl.study.provenance import machine

    atomic_write_json(
        cell.run_dir / DONE_FILE,
        {
            "command": argv,
            "seconds": seconds,
            "commit": commit,
            "machine": machine(_child_env()["OMP_NUM_THREADS"]),
            "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        },
    )


def read_metrics(cell: Cell) -> list[dict]:
    """The cell's ``metrics.jsonl`` rows (a torn last line, from a kill, is dropped)."""
    path = cell.run_dir / "metrics.jsonl"
    return (
        [row for row in read_jsonl_tolerant(path) if isinstance(row, dict)] if path.exists() else []
    )


def estimate_minutes(study: Study, root: Path, jobs: int = 1) -> tuple[float, int, int]:
    """(minutes for the whole study on ``jobs`` cores, cells timed here, cells in all):
    the mean of the cells measured here, else the declaration's estimate."""
    all_cells = cells(study, root)
    measured = [s for s in (cell_seconds(c) for c in all_cells) if s is not None]
    per_cell = sum(measured) / len(measured) / 60 if measured else study.minutes_per_cell
    return per_cell * len(all_cells) / max(1, jobs), len(measured), len(all_cells)
