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
* A file whose last line was cut (a crash or a full disk mid-write: no final
  newline, and not JSON) is repaired when it is opened, losing nothing: the cut
  bytes move to a file beside it (``records.jsonl.cut-line-N``), the file is cut
  back to its last whole line, and a warning names the file, the line and where
  the bytes went (:func:`set_aside_cut_line`). Appending after the cut line would
  leave a damaged line in the middle of the file, which every reader refuses.
* A last line that is whole JSON without a final newline (a user's file) gets a
  newline before the first appended line, so it is kept as it is rather than glued
  to ours.
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

from turnrl.io import atomic_write_bytes

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


_TAIL_BLOCK = 1 << 16
"""Bytes read at a time from the end of the file to find its last line."""


def _last_line_start(handle: Any, size: int) -> int:
    """Offset of the byte after the file's last newline (0 when it has none)."""
    end = size
    while end > 0:
        start = max(0, end - _TAIL_BLOCK)
        handle.seek(start)
        newline = handle.read(end - start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def _count_lines(handle: Any, end: int) -> int:
    """Newlines in the first ``end`` bytes."""
    handle.seek(0)
    count, left = 0, end
    while left > 0:
        block = handle.read(min(_TAIL_BLOCK, left))
        count += block.count(b"\n")
        left -= len(block)
    return count


def set_aside_cut_line(path: Path) -> Path | None:
    """Repair a records file whose last line was cut; the file the cut bytes went to.

    The last line is cut when the file does not end with a newline and that line is
    not a JSON object. Its bytes are written (whole, fsynced) to a new file beside ``path``
    named after the line (``NAME.cut-line-N``, ``-2``... if taken), and only then is
    ``path`` cut back to the end of its last whole line: nothing is lost, and new
    lines do not follow a damaged one. ``None`` when there was nothing to repair.
    """
    if not path.is_file():
        return None
    with open(path, "r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        start = _last_line_start(handle, size)
        if start == size:
            return None
        handle.seek(start)
        tail = handle.read()
        try:
            if isinstance(json.loads(tail), dict):
                return None  # a whole last line without its newline: kept (see _append)
        except ValueError:
            pass
        line = _count_lines(handle, start) + 1
        aside = path.with_name(f"{path.name}.cut-line-{line}")
        suffix = 1
        while aside.exists():
            suffix += 1
            aside = path.with_name(f"{path.name}.cut-line-{line}-{suffix}")
        atomic_write_bytes(aside, tail)
        handle.truncate(start)
        handle.flush()
        os.fsync(handle.fileno())
    logger.warning(
        "%s:%d: the last line was cut (%d bytes, not JSON, no final newline); moved to %s, "
        "and new trajectories follow line %d",
        path,
        line,
        len(tail),
        aside,
        line - 1,
    )
    return aside


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
        self.set_aside: Path | None = set_aside_cut_line(self.path)
        """Where a cut last line found on opening was moved (``None``: there was none)."""
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
