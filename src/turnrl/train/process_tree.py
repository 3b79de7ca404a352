"""The processes a run started, found and killed however far they wandered (Linux).

Agent commands run in their own process group, which is killed when the rollout
ends; but a program may leave its group (``setsid``, a double fork) and would then
outlive the run, re-parented to init. The trainer therefore makes itself a *child
subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``, for the life of the command or of a
batch of rollouts, then as before): orphans anywhere below it are re-parented to it
instead of init, so every process an agent started stays a
descendant of the trainer, found by walking ``/proc`` parent links, and is killed
and reaped by :func:`kill_new_descendants`.

On systems without ``/proc`` or ``prctl`` these are no-ops (process groups remain the
only guard there).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
"""``prctl`` options (linux/prctl.h)."""
REAP_WAIT_S = 2.0
"""How long :func:`kill_new_descendants` waits for killed processes to be gone."""


def _prctl() -> Any:
    """libc's ``prctl`` (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def is_subreaper() -> bool:
    """Whether this process is a child subreaper now."""
    prctl = _prctl()
    value = ctypes.c_int(0)
    return (
        prctl is not None
        and prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(value)) == 0
        and bool(value.value)
    )


def set_subreaper(on: bool) -> bool:
    """Make this process the reaper of its orphaned descendants (or stop); whether it
    worked."""
    prctl = _prctl()
    return prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0


@contextlib.contextmanager
def subreaper() -> Iterator[bool]:
    """Be a child subreaper inside (yields whether that worked), as before after."""
    before = is_subreaper()
    worked = set_subreaper(True)
    try:
        yield worked
    finally:
        if worked and not before:
            set_subreaper(False)


def _parents() -> dict[int, int]:
    """``pid -> ppid`` of every process visible in ``/proc``."""
    out: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            fields = stat.rpartition(")")[2].split()
            if len(fields) >= 2:
                out[int(entry.name)] = int(fields[1])
    return out


def descendants(root: int | None = None) -> set[int]:
    """Every living process below ``root`` (this process by default)."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, ()))
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rpartition(")")[2].split()
    return bool(fields) and fields[0] not in ("Z", "X")


def _reap(pids: set[int]) -> None:
    """Collect the exit status of those of ``pids`` that are zombie children of ours."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def kill_new_descendants(before: set[int]) -> list[int]:
    """SIGKILL every descendant of this process not in ``before`` (repeatedly, so that
    processes forked meanwhile go too), then reap them and the new orphans that ended
    by themselves (zombies re-parented to this subreaper); the pids killed."""
    _reap(descendants() - before)
    killed: set[int] = set()
    for _ in range(5):
        new = descendants() - before - killed
        alive = {pid for pid in new if _running(pid)}
        if not alive:
            break
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed |= alive
    deadline = time.monotonic() + REAP_WAIT_S
    while killed and time.monotonic() < deadline:
        _reap(killed)
        if not any(_running(pid) for pid in killed):
            break
        time.sleep(0.02)
    _reap(killed)
    return sorted(killed)


@contextlib.contextmanager
def no_process_left() -> Iterator[None]:
    """Be a subreaper inside, and kill (on leaving, however) every process started
    below this one meanwhile."""
    with subreaper():
        before = descendants()
        try:
            yield
        finally:
            kill_new_descendants(before)
