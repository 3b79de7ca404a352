"""Crash-safe file writes, used by every layer (pure standard library).

Two kinds of writes:

* **Atomic replace** (``atomic_write_text``/``_bytes``/``_json``, ``atomic_open``): the
  data goes to a temporary file in the same directory, is fsynced, then moved over the
  target with ``os.replace``. A reader sees either the old file or the new one, never a
  half-written one; a crash leaves at most a stray ``.tmp`` file, which no reader reads.
* **Append** (``append_jsonl``): one JSON object per line, flushed and fsynced. A crash
  can leave at most a partial *last* line; ``read_jsonl_tolerant`` skips exactly that
  and raises on damage anywhere else, naming the file and the line, and the next
  ``append_jsonl`` cuts the fragment off before writing.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

TMP_SUFFIX = ".tmp"
"""Suffix of the temporary files atomic writes create (readers ignore them)."""


def _fsync_dir(directory: Path) -> None:
    """Persist a rename on POSIX by fsyncing the directory (no-op where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Open a binary file for writing that appears at ``path`` only once complete.

    Yields a handle on a temporary file in the same directory; on normal exit the data
    is flushed, fsynced and moved over ``path``; on an exception the temporary file is
    removed and ``path`` is untouched. Use it to stream large payloads (e.g.
    ``torch.save(obj, handle)``) without holding a second copy in memory.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(target.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same dir, fsync, replace).

    Parent directories are created. Returns the target path.
    """
    with atomic_open(path) as handle:
        handle.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically (see ``atomic_write_bytes``)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> Path:
    """Write ``obj`` as JSON (UTF-8, trailing newline) to ``path`` atomically."""
    text = json.dumps(obj, indent=indent, ensure_ascii=False, allow_nan=True)
    return atomic_write_text(path, text + "\n")


def _truncate_partial_tail(handle: Any) -> None:
    """Cut an unterminated last line (left by a crash mid-append) from an open file.

    ``handle`` is opened ``"r+b"``. Scans backwards in blocks for the last newline and
    truncates just after it (or to empty when there is none).
    """
    end = handle.seek(0, os.SEEK_END)
    if end == 0:
        return
    handle.seek(end - 1)
    if handle.read(1) == b"\n":
        return
    position = end
    block = 4096
    while position > 0:
        start = max(0, position - block)
        handle.seek(start)
        chunk = handle.read(position - start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            handle.truncate(start + newline + 1)
            return
        position = start
    handle.truncate(0)


def append_jsonl(path: str | os.PathLike[str], obj: Any) -> None:
    """Append ``obj`` as one JSON line to ``path``, then flush and fsync.

    The line goes out in a single ``write``, so a crash leaves at most a partial final
    line. If the file already ends with such a partial line (an earlier crash), that
    fragment is truncated first: it is an incomplete record, and leaving it would put a
    corrupt line in the middle of the file once more lines follow.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(obj, ensure_ascii=False, allow_nan=True)
    if "\n" in line:  # json.dumps escapes newlines; guard against surprises anyway
        raise ValueError(f"{target}: JSON line unexpectedly contains a newline")
    target.touch(exist_ok=True)
    with open(target, "r+b") as handle:
        _truncate_partial_tail(handle)
        handle.seek(0, os.SEEK_END)
        handle.write(line.encode("utf-8") + b"\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl_tolerant(path: str | os.PathLike[str]) -> list[Any]:
    """Read a JSONL file written by ``append_jsonl``, tolerating a crash-truncated tail.

    Blank lines are skipped. A final line that does not parse *and* is not terminated
    by a newline is the trace of an interrupted append: it is dropped. Any other line
    that does not parse raises ``ValueError`` naming the file and the 1-based line.
    """
    source = Path(path)
    raw = source.read_bytes()
    lines = raw.split(b"\n")
    # After split, the last element is b"" iff the file ends with a newline.
    last_unterminated = len(lines) - 1 if lines and lines[-1] != b"" else None
    records: list[Any] = []
    for index, chunk in enumerate(lines):
        if not chunk.strip():
            continue
        try:
            records.append(json.loads(chunk.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            if index == last_unterminated:
                break
            raise ValueError(f"{source}:{index + 1}: corrupt JSON line ({err})") from err
    return records


def truncate_jsonl_steps(path: str | os.PathLike[str], last_step: int) -> None:
    """Keep only the rows of a metrics log with ``step <= last_step``, atomically.

    Resuming from the checkpoint of ``last_step`` drops rows of unfinished steps
    (and a crash-truncated last line, see :func:`read_jsonl_tolerant`).
    """
    kept = [row for row in read_jsonl_tolerant(path) if row["step"] <= last_step]
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in kept))
