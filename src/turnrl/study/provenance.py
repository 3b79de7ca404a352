"""Where a summary's numbers come from: commit, command, machine, date."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path

from turnrl.study.declaration import STUDIES_DIR


def git_commit(root: Path) -> str:
    """``HEAD``'s commit, with ``+ uncommitted changes`` when the tree is dirty."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown (no git)"
    return (commit or "unknown") + (" + uncommitted changes" if dirty else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(omp_threads: str | None = None) -> str:
    """CPU, cores, OS and library versions, and the ``OMP_NUM_THREADS`` the runs had
    (``omp_threads``; default: this process's)."""
    import torch

    threads = omp_threads or os.environ.get("OMP_NUM_THREADS", "unset")
    return (
        f"{cpu_model()}, {os.cpu_count()} cores; {platform.system()} {platform.release()}; "
        f"python {platform.python_version()}, torch {torch.__version__}, numpy "
        f"{__import__('numpy').__version__}; OMP_NUM_THREADS={threads}"
    )


def _short(argv: list[str], root: Path) -> str:
    """A command with the repository root and the interpreter's path shortened. The
    root is this checkout's and the one the cell ran in (the part of its ``run_dir``
    before ``runs/studies/``): cells copied from another checkout read the same."""
    interpreter = bool(argv) and Path(argv[0]).name.startswith("python")
    text = " ".join(["python", *argv[1:]]) if interpreter else " ".join(argv)
    roots = {str(root)}
    marker = f"/{STUDIES_DIR.as_posix()}/"
    for arg in argv:
        if arg.startswith("run_dir=") and marker in arg:
            roots.add(arg.removeprefix("run_dir=").split(marker)[0])
    for prefix in roots:
        text = text.replace(f"{prefix}/", "")
    return text


def block(root: Path, run_command: str, summary_command: str, cells: list[dict]) -> str:
    """The provenance lines of a summary; ``cells`` are the finished cells' records
    (what the runner wrote: command, seconds, commit, machine, date)."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    commits = sorted({c.get("commit", "unknown") for c in cells})
    machines = sorted({c.get("machine", "unknown") for c in cells})
    dates = sorted(c["finished"] for c in cells if "finished" in c)
    minutes = sum(float(c.get("seconds", 0.0)) for c in cells) / 60
    example = next((c["command"] for c in cells if "command" in c), None)
    lines = [
        f"- runs: `{run_command}` at commit {', '.join(commits)}",
        *([f"- one cell's exact command: `{_short(example, root)}`"] if example else []),
        f"- machine: {'; '.join(machines)}",
        f"- {len(cells)} cells, {minutes:.0f} minutes of wall time (one process each)"
        + (f", finished {dates[0]} to {dates[-1]}" if dates else ""),
        f"- summary: `{summary_command}` at commit {git_commit(root)}, {now}",
    ]
    return "\n".join(lines)
