"""The exclusive lock a run holds on its run directory, so two processes never write
one run (two ``--resume`` of one directory would interleave steps and overwrite each
other's checkpoints).

The lock is ``fcntl.flock`` on ``RUN_DIR/.turnrl.lock``, which holds the holder's pid
(for the message of the process that is refused). The kernel releases it when the
holding process ends, however it ends (``kill -9`` included), so a stale lock file
never blocks a later run. Within one process the lock is re-entrant: the CLI's guard,
the trainer and a resumed trainer in tests all open the same directory; the file is
unlocked when the last of them is released.

Where ``fcntl`` does not exist (Windows), runs are not locked.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from turnrl.errors import UsageError

LOCK_FILE = ".turnrl.lock"
"""The lock file's name inside a run directory (never counted as the run's content)."""


class RunLockedError(UsageError):
    """Another process holds the run directory (the message names its pid)."""


class _Held:
    """One locked directory of this process: the open lock file and how many hold it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.count = 0


_HELD: dict[Path, _Held] = {}
_GUARD = threading.Lock()


def _key(directory: Path) -> Path:
    return Path(os.path.realpath(directory))


def is_locked_here(directory: str | os.PathLike[str]) -> bool:
    """Whether this process holds the lock of ``directory``."""
    with _GUARD:
        return _key(Path(directory)) in _HELD


def acquire(directory: str | os.PathLike[str]) -> RunLock:
    """Lock the existing directory ``directory`` for this process, or raise
    :class:`RunLockedError` naming the holder's pid. Release it with
    :meth:`RunLock.release` (or let the process end)."""
    path = Path(directory)
    key = _key(path)
    with _GUARD:
        held = _HELD.get(key)
        if held is None:
            held = _HELD[key] = _Held(_lock(path))
        held.count += 1
    return RunLock(key)


def _lock(directory: Path) -> int:
    """Open and flock the lock file (not inherited by child processes); write our pid."""
    try:
        import fcntl
    except ImportError:  # no flock on this platform: unlocked
        return -1
    lock_path = directory / LOCK_FILE
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        raise RunLockedError(
            f"run_dir {directory} is in use by another turnrl process "
            f"(pid {holder or 'unknown'}, lock {lock_path}); wait for it to end, stop it, "
            "or use another run_dir"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class RunLock:
    """One hold of a run directory's lock (see :func:`acquire`)."""

    def __init__(self, key: Path) -> None:
        self.key = key
        self.released = False

    def release(self) -> None:
        """Give up this hold; the file is unlocked when no hold of this process is left."""
        if self.released:
            return
        self.released = True
        with _GUARD:
            held = _HELD.get(self.key)
            if held is None:
                return
            held.count -= 1
            if held.count <= 0:
                del _HELD[self.key]
                if held.fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(held.fd)  # closing the last descriptor unlocks
