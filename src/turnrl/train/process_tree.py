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


def multiprocessing_services() -> set[int]:
    """The pid of multiprocessing's resource tracker where this process started one (a
    spawned sampler process's queues do). It unlinks this process's named semaphores
    when they are released and leaves by itself when this process exits (it reads a
    pipe only this process writes). Killed with the run's other processes, it would be
    relaunched at the interpreter's exit, be told to unlink semaphores it never saw,
    and print a ``KeyError`` traceback for each."""
    from multiprocessing import resource_tracker

    pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    return {pid} if pid is not None else set()


def kill_new_descendants(before: set[int]) -> list[int]:
    """SIGKILL every descendant of this process not in ``before`` (repeatedly, so that
    processes forked meanwhile go too), then reap them and the new orphans that ended
    by themselves (zombies re-parented to this subreaper); the pids killed.

    Multiprocessing's resource tracker is spared (:func:`multiprocessing_services`)."""
    before = before | multiprocessing_services()
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


# ----------------------------------------------------- when the trainer itself is killed

PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal a process gets when the thread that forked it ends."""
WATCHDOG_VARIABLE = "TURNRL_WATCHDOG"
"""Set (to the batch's token) in every command agent's environment, which its own
children inherit: how the watchdog finds them once the trainer is gone."""
WATCHDOG_WAIT_S = 10.0
"""How long closing a batch waits for its watchdog to finish its last scan."""

_WATCHDOG = """
import os, signal, sys, time
mark = sys.argv[1].encode()
sys.stdin.buffer.read()  # EOF: the trainer closed the pipe, or died (any signal)
me = os.getpid()
for _ in range(50):
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/" + name + "/environ", "rb") as handle:
                if mark in handle.read().split(b"\\0"):
                    found.append(int(name))
        except OSError:
            pass
    if not found:
        break
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.05)
"""
"""The watchdog's program: wait for the trainer's end of a pipe to close, then SIGKILL
every process whose environment holds the batch's mark (until none is left)."""

_active_mark: str | None = None


def die_with_parent(parent: int, uid: int | None = None) -> None:
    """``preexec_fn`` of a command agent: SIGKILL it when the trainer's thread that
    started it ends (``PR_SET_PDEATHSIG``; whatever killed the trainer, SIGKILL too).
    Only the direct child is covered: the watchdog (:func:`agent_watchdog`) covers
    the processes it starts. With ``uid`` (the trainer is root), first drop to that
    user and group, without supplementary groups (a change of user clears the death
    signal, so it is set after)."""
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the trainer died before prctl: go now
        os._exit(1)


def watchdog_environment() -> dict[str, str]:
    """The variable a command agent gets inside :func:`agent_watchdog` (else none)."""
    return {} if _active_mark is None else {WATCHDOG_VARIABLE: _active_mark}


@contextlib.contextmanager
def agent_watchdog(enabled: bool = True) -> Iterator[None]:
    """Inside, a watchdog process kills every command agent of the batch, and every
    process they started (in their group or not), once this process ends, however
    it ends: SIGKILL (the OOM killer's) leaves no handler to run, and those processes
    would live on under init.

    The watchdog (its own session, so that a signal to the trainer's group spares it)
    reads a pipe whose only write end this process holds: the kernel closes it when
    the process dies. It then SIGKILLs every process whose environment holds this
    batch's mark (:data:`WATCHDOG_VARIABLE`, a random token, inherited by children;
    a process that clears its environment escapes, so does one of another user the
    watchdog may not signal). On a normal exit the pipe is closed here, the watchdog
    finds nothing left (the batch killed its processes) and ends; it is waited for.
    """
    global _active_mark
    if not enabled or not sys.platform.startswith("linux"):
        yield
        return
    import secrets
    import subprocess

    mark = secrets.token_hex(16)
    read_end, write_end = os.pipe()
    try:
        watchdog = subprocess.Popen(
            [sys.executable, "-S", "-c", _WATCHDOG, f"{WATCHDOG_VARIABLE}={mark}"],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        os.close(read_end)
    _active_mark = mark
    try:
        yield
    finally:
        _active_mark = None
        os.close(write_end)
        try:
            watchdog.wait(timeout=WATCHDOG_WAIT_S)
        except subprocess.TimeoutExpired:
            watchdog.kill()
            watchdog.wait()
