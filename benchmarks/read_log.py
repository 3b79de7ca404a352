"""Benchmark ``turnrl credit`` on a large log: time and peak memory, against the
strict per-record reader measured in the same run.

Run: ``make bench`` (runs this after ``benchmarks/credit.py``), or
``.venv/bin/python benchmarks/read_log.py [--rows N] [--write]``.

A synthetic rollout log of ``--rows`` lines (default 717,000, about 200 MB: the size
of the log in issue #15) is generated with a fixed seed: trajectories of 1-5 turns,
4 per task, each line a compact JSON turn record as the trainers write them (ids,
turn, role, a string prompt, a response, response token ids, reward, done,
temperature, policy version). Each measurement runs in a fresh child process, so its
peak resident memory (``ru_maxrss`` from ``os.wait4``) is its own:

* **new**: ``python -m turnrl.cli credit LOG -o OUT --estimator grpo``, the whole
  command (imports, columnar read with validation, credit, the output written);
* **baseline**: the strict reader as every line was read before this benchmark
  existed (``turnrl.records.read_records``: the standard library's ``json`` with the
  strict checks, one typed ``TurnRecord`` per line, then ``TurnTable.from_records``),
  reading only: no credit and no output, so the ratio understates the old cost.

Targets (issue #15): ``turnrl credit`` in at most 5 s and at most 2x the file's size
in peak memory. The machine's load is printed: wall times on a shared machine are
noisy, the CPU times (user + system) of the child less so. ``--write`` puts the table
into the "## Reading a log" section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).with_name("RESULTS.md")
sys.path.insert(0, str(Path(__file__).parent))
from results_file import replace_section  # noqa: E402

SECTION = "## Reading a log"
TARGET_SECONDS = 5.0
TARGET_MEMORY = 2.0
WORDS = [
    "add",
    "the",
    "result",
    "of",
    "multiply",
    "then",
    "tool",
    "call",
    "answer",
    "number",
    "step",
    "check",
]

BASELINE = """
import sys
from turnrl.records import read_records
from turnrl.table import TurnTable
table = TurnTable.from_records(read_records(sys.argv[1]), source=sys.argv[1])
print(table.n_rows)
"""


def generate(path: Path, n_rows: int, seed: int = 0) -> None:
    """Write ``n_rows`` compact turn-record lines (see the module docstring)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 6, size=n_rows)  # more trajectories than needed
    wins = rng.random(size=n_rows) < 0.4
    words = rng.integers(0, len(WORDS), size=(n_rows, 13))
    ids = rng.integers(0, 32_000, size=(n_rows, 6))
    row = 0
    traj = 0
    with open(path, "w", encoding="utf-8") as out:
        while row < n_rows:
            task, episode = divmod(traj, 4)
            length = int(min(lengths[traj], n_rows - row))
            for turn in range(length):
                last = turn == length - 1
                w = words[row]
                prompt = "What is " + " ".join(WORDS[i] for i in w[:8]) + "?"
                response = "<tool>" + " ".join(WORDS[i] for i in w[8:]) + "</tool>"
                reward = "1.0" if last and wins[traj] else "0.0"
                out.write(
                    f'{{"task_id":"calc-{task:06d}","traj_id":"calc-{task:06d}/e{episode}",'
                    f'"turn":{turn},"role":"agent","prompt":"{prompt}","response":"{response}",'
                    f'"response_ids":[{",".join(map(str, ids[row]))}],"reward":{reward},'
                    f'"done":{"true" if last else "false"},"temperature":1.0,'
                    f'"policy_version":{task // 64}}}\n'
                )
                row += 1
            traj += 1


@dataclass
class Run:
    wall: float
    cpu: float
    peak_mib: float


def measure(argv: list[str]) -> Run:
    """Wall time, CPU time and peak RSS of one child process running ``argv``."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{argv[:4]}... exited with {child.returncode}")
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=717_000)
    parser.add_argument("--repeats", type=int, default=2, help="runs of the new command")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    console = Console()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        log, out = Path(tmp) / "log.jsonl", Path(tmp) / "out.jsonl"
        started = time.perf_counter()
        generate(log, args.rows)
        size_mib = log.stat().st_size / 2**20
        console.print(
            f"log: {args.rows:,} rows, {size_mib:.1f} MiB "
            f"(generated in {time.perf_counter() - started:.1f} s); load average {load:.1f}"
        )
        command = [sys.executable, "-m", "turnrl.cli", "credit", str(log), "-o", str(out)]
        new = [measure([*command, "--estimator", "grpo"]) for _ in range(args.repeats)]
        baseline = measure([sys.executable, "-c", BASELINE, str(log)])
    best = min(new, key=lambda r: r.wall)
    peak = max(r.peak_mib for r in new)
    rows = [
        ("`turnrl credit --estimator grpo` (columnar reader)", best, peak),
        (
            "baseline: strict reader, `read_records` + `from_records` (reading only)",
            baseline,
            baseline.peak_mib,
        ),
    ]
    table = Table(title=f"turnrl credit on {args.rows:,} rows ({size_mib:.0f} MiB)")
    for column in ("run", "wall s", "CPU s", "peak MiB", "peak / file"):
        table.add_column(column)
    lines = [
        "| run | wall (s) | CPU (s) | peak RSS (MiB) | peak / file size |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, run, mib in rows:
        cells = (f"{run.wall:.2f}", f"{run.cpu:.2f}", f"{mib:.0f}", f"{mib / size_mib:.2f}x")
        table.add_row(name, *cells)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    console.print(table)
    speedup = baseline.cpu / best.cpu
    verdict = (
        f"new vs baseline: {speedup:.1f}x less CPU time; targets: wall <= {TARGET_SECONDS:.0f} s "
        f"({'ok' if best.wall <= TARGET_SECONDS else 'MISSED'}: {best.wall:.2f} s, CPU "
        f"{best.cpu:.2f} s), peak <= {TARGET_MEMORY:.0f}x the file "
        f"({'ok' if peak <= TARGET_MEMORY * size_mib else 'MISSED'}: {peak / size_mib:.2f}x)"
    )
    console.print(verdict)
    if args.write:
        body = "\n".join(
            [
                SECTION,
                "",
                f"- command: `make bench` (= `.venv/bin/python benchmarks/read_log.py "
                f"--rows {args.rows} --write` after `benchmarks/credit.py`)",
                f"- date: {dt.datetime.now():%Y-%m-%d %H:%M}",
                f"- machine: {platform.machine()}, {os.cpu_count()} cores, Python "
                f"{platform.python_version()}; shared with other jobs (1-min load average "
                f"{load:.1f} at start), so wall times are noisy; CPU = user + system time of "
                "the child process",
                f"- data: {args.rows:,} generated rollout lines, {size_mib:.1f} MiB "
                "(seed 0; see the script's docstring)",
                f"- method: each run a fresh child process; new = best wall time of "
                f"{args.repeats} runs of the whole command (peak = the highest); baseline = one "
                "run of the strict per-record reader, reading only",
                "",
                *lines,
                "",
                verdict,
            ]
        )
        replace_section(SECTION, body, RESULTS)
        console.print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
