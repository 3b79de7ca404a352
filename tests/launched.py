"""Running ``torchrun`` (or one CLI process) from a test, and leaving nothing behind.

``subprocess.run(..., timeout=...)`` kills only the launcher with SIGKILL: torchrun
cannot pass that on, and it starts every rank in a session of its own, so the ranks
(and the sampler processes they started) kept running after the test failed, a core
each, until someone killed them by hand. :func:`run_launcher` kills every child's
process group first, then the launcher's.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest


def children(parent: int) -> list[int]:
    """The pids whose parent is ``parent`` (read from /proc; empty where there is none)."""
    found = []
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def rank_processes(launcher: int) -> dict[int, int]:
    """``{rank: pid}`` of the processes torchrun (``launcher``) started."""
    found = {}
    for pid in children(launcher):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in environ:
            if item.startswith(b"RANK="):
                found[int(item[5:])] = pid
    return found


def _kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads, or ``pid`` alone where it leads none."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_launcher(process: subprocess.Popen[str]) -> str:
    """Kill ``process`` (started with ``start_new_session=True``), its children's groups
    (torchrun's ranks lead sessions of their own) and its own group; reap it and return
    what is left of its stderr (empty where a survivor still holds the pipe)."""
    if process.poll() is None:
        for pid in children(process.pid):
            _kill_group(pid)
        _kill_group(process.pid)
    try:
        return process.communicate(timeout=60)[1] or ""
    except (subprocess.TimeoutExpired, ValueError):
        return ""


def run_launcher(
    args: Sequence[str], *, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(args, capture_output=True, text=True)`` that fails the test after
    ``timeout`` seconds with every process it started killed (see the module)."""
    process = subprocess.Popen(
        list(args),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        partial = stop_launcher(process)
        pytest.fail(f"ran past {timeout:g} s, every process it started killed:\n{partial[-6000:]}")
    except BaseException:
        stop_launcher(process)
        raise
    return subprocess.CompletedProcess(list(args), process.returncode, stdout, stderr)
