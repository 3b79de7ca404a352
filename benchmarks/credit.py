"""Benchmark every credit estimator against the per-row reference implementation.

Run: ``make bench`` (= ``.venv/bin/python benchmarks/credit.py``).

A synthetic log of 1,000,000 rows over 100,000 tasks is generated with a fixed
seed (3-4 trajectories per task of 1-5 turns, sparse rewards, two roles, state
keys, information gain on non-final turns, node ids shared at turn 0 per task and
at turn-1 branch points, q values; rows shuffled) and loaded with
``TurnTable.from_arrays``. For each estimator it reports the best of 3 wall-clock
times (``time.perf_counter``) and the tracemalloc peak (numpy reports its buffers
to tracemalloc) of the vectorised estimator, and the time of one run of
``turnrl.credit.reference`` on the same rows, asserting equal results
(``np.allclose``, rtol 1e-9). The table is printed with rich and written as
markdown into the "## Credit estimators" section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import platform
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from turnrl.credit import compute_credit, list_estimators, reference
from turnrl.table import TurnTable

RESULTS = Path(__file__).with_name("RESULTS.md")
sys.path.insert(0, str(Path(__file__).parent))
from results_file import replace_section  # noqa: E402

SECTION = "## Credit estimators"
TARGET_SPEEDUP = {"grpo": 50.0, "turn_group": 50.0, "node": 50.0}
TARGET_SECONDS = 2.0


# ----------------------------------------------------------------- data
def generate(n_rows: int, n_tasks: int, seed: int) -> dict[str, np.ndarray]:
    """Per-row arrays of a synthetic multi-turn log with exactly ``n_rows`` rows."""
    rng = np.random.default_rng(seed)
    trajs_per_task = rng.choice([3, 4], size=n_tasks, p=[2 / 3, 1 / 3])
    n_trajs = int(trajs_per_task.sum())
    length = rng.integers(1, 6, size=n_trajs)
    # Nudge random trajectories by one turn so the total is exactly n_rows.
    short = n_rows - int(length.sum())
    can = np.flatnonzero(length < 5) if short > 0 else np.flatnonzero(length > 1)
    length[rng.choice(can, size=abs(short), replace=False)] += np.sign(short)

    traj_task = np.repeat(np.arange(n_tasks), trajs_per_task)
    first_traj = np.concatenate(([0], np.cumsum(trajs_per_task)[:-1]))
    index_in_task = np.arange(n_trajs) - np.repeat(first_traj, trajs_per_task)
    traj = np.repeat(np.arange(n_trajs), length)
    start = np.concatenate(([0], np.cumsum(length)[:-1]))
    turn = np.arange(n_rows) - np.repeat(start, length)
    task = traj_task[traj]
    last = turn == length[traj] - 1

    # Sparse rewards: success (1) on the final turn 40% of the time, a tool cost
    # (-0.1) on 10% of the other turns.
    reward = np.where(last, (rng.random(n_rows) < 0.4) * 1.0, 0.0)
    reward[~last & (rng.random(n_rows) < 0.1)] = -0.1
    role = turn % 2
    # State keys: one of two states per (task, turn); 20% of rows have none.
    state = (task * 8 + turn) * 2 + rng.integers(0, 2, size=n_rows)
    state_key = np.array(state, dtype=object)
    state_key[rng.random(n_rows) < 0.2] = None
    # Node ids: turn 0 shared by the task's trajectories; at turn 1 pairs of
    # trajectories share a branch point; later turns are distinct.
    branch = task * 16 + 1 + index_in_task[traj] // 2
    node = np.where(turn == 0, task * 16, np.where(turn == 1, branch, (n_tasks + traj) * 16 + turn))
    info_gain = np.where(last, np.nan, rng.normal(0.0, 0.5, size=n_rows))
    q = rng.normal(0.0, 1.0, size=n_rows)

    order = rng.permutation(n_rows)
    columns = {
        "task_id": task,
        "traj_id": traj,
        "turn": turn,
        "reward": reward,
        "role": role,
        "state_key": state_key,
        "node_id": node,
        "info_gain": info_gain,
        "q": q,
    }
    return {name: values[order] for name, values in columns.items()}


def subset(arrays: dict[str, np.ndarray], n_tasks: int) -> dict[str, np.ndarray]:
    """The rows of the first ``n_tasks`` task ids (whole tasks, so groups stay intact)."""
    keep = arrays["task_id"] < n_tasks
    return {name: values[keep] for name, values in arrays.items()}


# ------------------------------------------------------------ measuring
def best_time(fn: Callable[[], object], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def peak_mib(fn: Callable[[], object]) -> float:
    """tracemalloc peak above the starting level during one call, in MiB."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return (peak - base) / 2**20


@dataclass
class Row:
    estimator: str
    seconds: float
    peak_mib: float
    ref_rows: int
    seconds_on_ref_rows: float
    ref_seconds: float
    equal: bool

    @property
    def speedup(self) -> float:
        return self.ref_seconds / self.seconds_on_ref_rows

    def verdict(self) -> str:
        misses = []
        if self.seconds >= TARGET_SECONDS:
            misses.append(f">= {TARGET_SECONDS:g} s")
        target = TARGET_SPEEDUP.get(self.estimator)
        if target is not None and self.speedup < target:
            misses.append(f"< {target:g}x")
        return "misses " + ", ".join(misses) if misses else "ok"


def run_estimator(name: str, table: TurnTable, ref_table: TurnTable, rows: list) -> Row:
    seconds = best_time(lambda: compute_credit(table, name))
    peak = peak_mib(lambda: compute_credit(table, name))
    if ref_table is table:
        seconds_on_ref_rows = seconds
    else:
        seconds_on_ref_rows = best_time(lambda: compute_credit(ref_table, name))
    credit = compute_credit(ref_table, name)
    start = time.perf_counter()
    want = reference.REFERENCE[name](rows)
    ref_seconds = time.perf_counter() - start
    equal = bool(np.allclose(credit.advantages, want, rtol=1e-9, atol=1e-9))
    if name == "a2tgpo":
        clip = reference.a2tgpo_clip_factor(rows)
        equal &= bool(np.allclose(credit.clip_factor, clip, rtol=1e-9, atol=1e-12))
    del want
    return Row(name, seconds, peak, ref_table.n_rows, seconds_on_ref_rows, ref_seconds, equal)


# ------------------------------------------------------------- reporting
def markdown(results: list[Row], header: dict[str, str], subset_rows: bool) -> str:
    lines = [SECTION, ""]
    lines += [f"- {key}: {value}" for key, value in header.items()]
    columns = ["estimator", "vectorised (best of 3)", "peak memory (tracemalloc)"]
    if subset_rows:
        columns.append("vectorised on the reference rows")
    columns += ["reference (1 run)", "speedup", "equal", "targets"]
    lines += ["", "| " + " | ".join(columns) + " |"]
    lines.append("|---|" + "---:|" * (len(columns) - 3) + "---|---|")
    for r in results:
        cells = [f"`{r.estimator}`", f"{r.seconds * 1e3:.1f} ms", f"{r.peak_mib:.1f} MiB"]
        if subset_rows:
            cells.append(f"{r.seconds_on_ref_rows * 1e3:.1f} ms")
        cells += [
            f"{r.ref_seconds:.2f} s",
            f"{r.speedup:.0f}x",
            "yes" if r.equal else "NO",
            r.verdict(),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument(
        "--reference-tasks",
        type=int,
        default=None,
        help="run the reference on the rows of this many tasks only (default: all rows)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--estimators", nargs="*", default=list_estimators())
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    args = parser.parse_args()
    console = Console()
    load = os.getloadavg()[0]

    arrays = generate(args.rows, args.tasks, args.seed)
    build = best_time(lambda: TurnTable.from_arrays(**arrays))
    table = TurnTable.from_arrays(**arrays)
    console.print(
        f"{table.n_rows:,} rows, {table.n_tasks:,} tasks, {table.n_trajectories:,} trajectories; "
        f"TurnTable.from_arrays {build:.2f} s (best of 3)"
    )
    if args.reference_tasks is None:
        ref_table = table
    else:
        ref_table = TurnTable.from_arrays(**subset(arrays, args.reference_tasks))
    start = time.perf_counter()
    rows = reference.rows_from_table(ref_table)
    to_rows = time.perf_counter() - start

    results = []
    for name in args.estimators:
        results.append(run_estimator(name, table, ref_table, rows))
        r = results[-1]
        console.print(
            f"  {name:<11} {r.seconds * 1e3:8.1f} ms  ref {r.ref_seconds:6.2f} s  "
            f"{r.speedup:6.0f}x  equal={r.equal}"
        )

    shown = Table(title=f"Credit estimators, {table.n_rows:,} rows")
    columns = ("estimator", "best of 3", "peak MiB", "reference", "speedup", "equal", "targets")
    for column in columns:
        shown.add_column(column, justify="left" if column in ("estimator", "targets") else "right")
    for r in results:
        shown.add_row(
            r.estimator,
            f"{r.seconds * 1e3:.1f} ms",
            f"{r.peak_mib:.1f}",
            f"{r.ref_seconds:.2f} s",
            f"{r.speedup:.0f}x",
            "yes" if r.equal else "NO",
            r.verdict(),
        )
    console.print(shown)

    header = {
        "command": "`make bench` (= `.venv/bin/python benchmarks/credit.py`)",
        "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"numpy {np.__version__}; shared with other agents' jobs "
            f"(1-min load average {load:.1f} at start), so absolute times are noisy; "
            "speedups compare runs in the same process on the same data"
        ),
        "data": (
            f"{table.n_rows:,} rows, {table.n_tasks:,} tasks, {table.n_trajectories:,} "
            f"trajectories (seed {args.seed}, rows shuffled); reference on "
            f"{ref_table.n_rows:,} rows"
        ),
        "TurnTable.from_arrays": (
            f"{build:.2f} s (best of 3; includes factorising the object-dtype state keys "
            "in Python and the trajectory checks); "
            f"decoding the table into reference dict rows: {to_rows:.1f} s (not timed below)"
        ),
        "method": (
            "vectorised = `compute_credit(table, name)` with default options; peak = "
            "tracemalloc peak above the starting level during one call (numpy reports its "
            "buffers to tracemalloc); reference = `turnrl.credit.reference` (plain Python "
            "loops over dict rows), run once, its memory not measured; results compared "
            "with `np.allclose(rtol=1e-9, atol=1e-9)` (and a2tgpo's clip factors)"
        ),
        "targets": (
            f"every estimator < {TARGET_SECONDS:g} s on all rows; >= 50x faster than the "
            "reference for grpo, turn_group and node"
        ),
    }
    text = markdown(results, header, ref_table is not table)
    if not args.no_write:
        replace_section(SECTION, text, RESULTS)
        console.print(f"wrote {RESULTS}")
    if not all(r.equal for r in results):
        raise SystemExit("vectorised and reference results differ")


if __name__ == "__main__":
    main()
