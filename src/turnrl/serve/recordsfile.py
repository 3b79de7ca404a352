"""The ``--records`` file: finished trajectories appended as JSONL, nothing lost.

* The path is checked when the gateway starts (:func:`check_records_path`): an
  existing regular file we may write, or a file we may create. A directory, a
  device or an unwritable place fails then, not at the first reward.
* A trajectory goes out in one ``write`` followed by ``fsync``. If the write
  fails, the bytes this write added are cut off again (only those: the file is
  never truncated below its size before the write) and the trajectory stays in
  a queue, in order; every later trajectory, :meth:`RecordsFile.flush` and
  :meth:`RecordsFile.close` retry the queue first. :attr:`RecordsFile.pending`
  and :attr:`RecordsFile.last_error` expose it (``GET /health``).
* A file that does not end with a newline (a user's file, or one cut by a
  crash) gets a newline before the first appended line, so its last line is
  kept as it is rather than glued to ours or dropped.
* :meth:`RecordsFile.close` writes what still could not be appended to a fresh
  file in the system temporary directory and logs its path.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger("turnrl.serve")


class RecordsPathError(ValueError):
    """The records path cannot be used (the message names the path and why)."""


def check_records_path(path: str | os.PathLike[str]) -> Path:
    """``path`` if it is a writable regular file, or a file that can be created."""
    target = Path(path)
    if target.exists():
        if target.is_dir():
            raise RecordsPathError(f"{target}: is a directory, not a JSONL file")
        if not target.is_file():
            raise RecordsPathError(f"{target}: not a regular file (a device, FIFO or socket?)")
        if not os.access(target, os.W_OK):
            raise RecordsPathError(f"{target}: not writable")
        return target
    if target.is_symlink():
        raise RecordsPathError(f"{target}: a symbolic link to a missing file")
    ancestor = target.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise RecordsPathError(f"{target}: cannot be created, {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise RecordsPathError(f"{target}: cannot be created, {ancestor} is not writable")
    return target


def _jsonl(records: Iterable[Mapping[str, Any]]) -> bytes:
    return b"".join(json.dumps(r, ensure_ascii=False).encode("utf-8") + b"\n" for r in records)


def _append(path: Path, data: bytes) -> None:
    """Append ``data`` after a newline if the file lacks a final one; on failure, cut
    off only what this call wrote."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        start = handle.seek(0, os.SEEK_END)
        if start > 0:
            handle.seek(start - 1)
            if handle.read(1) != b"\n":
                data = b"\n" + data
        try:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                handle.truncate(start)
            raise


class RecordsFile:
    """Appends trajectories to a JSONL file, keeping the ones it could not write yet."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = check_records_path(path)
        self._lock = threading.Lock()
        self._queue: deque[bytes] = deque()
        self.last_error: str | None = None
        """The last write failure (``None`` once a write succeeds)."""

    @property
    def pending(self) -> int:
        """Trajectories waiting to be written (after failed writes)."""
        return len(self._queue)

    def submit(self, records: Iterable[Mapping[str, Any]]) -> bool:
        """Queue one trajectory and write the queue; ``True`` if all of it is written."""
        data = _jsonl(records)
        with self._lock:
            if data:
                self._queue.append(data)
            return self._flush_locked() == 0

    def flush(self) -> int:
        """Retry the queue; the number of trajectories still unwritten."""
        with self._lock:
            return self._flush_locked()

    def _flush_locked(self) -> int:
        while self._queue:
            try:
                _append(self.path, self._queue[0])
            except OSError as exc:
                self.last_error = f"{self.path}: {exc.strerror or exc}"
                logger.error(
                    "could not append to the records file (%s); %d trajectories kept in memory, "
                    "retried with the next one",
                    self.last_error,
                    len(self._queue),
                )
                return len(self._queue)
            self._queue.popleft()
            self.last_error = None
        return 0

    def close(self) -> Path | None:
        """Flush; what is still unwritten goes to a new file in the temporary directory,
        whose path is returned (and logged). ``None`` when everything was written."""
        with self._lock:
            if self._flush_locked() == 0:
                return None
            fd, name = tempfile.mkstemp(prefix="turnrl-unwritten-", suffix=".jsonl")
            with os.fdopen(fd, "wb") as handle:
                handle.write(b"".join(self._queue))
            logger.error(
                "%d trajectories could not be appended to %s; they are in %s",
                len(self._queue),
                self.path,
                name,
            )
            self._queue.clear()
            return Path(name)
