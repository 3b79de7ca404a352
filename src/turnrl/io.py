"""Strict JSON-lines reading and crash-safe file writes, used by every layer.

Reading (:func:`iter_jsonl`, :func:`parse_json_line`, :func:`open_input`) lives in
:mod:`turnrl.strict_json` and is re-exported here, so that callers find every file
operation in one place; this module is the writing side (and ``read_jsonl_tolerant``,
the reader of what ``append_jsonl`` writes).

Two kinds of writes:

* **Atomic replace** (``atomic_write_text``/``_bytes``/``_json``, ``atomic_open``): the
  data goes to a temporary file in the same directory, is fsynced, then moved over the
  target with ``os.replace``. A reader sees either the old file or the new one, never a
  half-written one; a crash leaves at most a stray ``.tmp`` file, which no reader reads.
* **Append** (``append_jsonl``): one JSON object per line, flushed and fsynced. A crash
  can leave at most a partial *last* line; ``read_jsonl_tolerant`` skips exactly that
  and raises on damage anywhere else, naming the file and the line, and the next
  ``append_jsonl`` cuts the fragment off before writing.

A write that fails because of where it goes (no space left on the device, a disk
quota, a read-only file system, a missing permission, a directory that vanished) is
an :class:`~turnrl.errors.OutputError` naming the cause and the path
(:func:`write_failure`), and leaves the earlier file as it was: an atomic write
removes its temporary file, an append cuts its partial line off again, and
:func:`replace_directory` puts the previous directory back.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from turnrl.errors import InputError, OutputError
from turnrl.strict_json import INT64_MAX, INT64_MIN, iter_jsonl, open_input, parse_json_line

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "TMP_SUFFIX",
    "WRITE_FAILURES",
    "append_jsonl",
    "atomic_open",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "check_output_path",
    "iter_jsonl",
    "naming_write_failures",
    "open_input",
    "parse_json_line",
    "read_jsonl_tolerant",
    "replace_directory",
    "resolve_output",
    "truncate_jsonl_steps",
    "write_failure",
]

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


def _current_umask() -> int:
    """The process umask (read by setting it and putting it back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def resolve_output(path: str | os.PathLike[str]) -> tuple[Path, int]:
    """Where a write to ``path`` must land, and the mode the new file gets.

    A symlink is followed, so the write goes *through* it (its target is replaced,
    the link stays). An existing target keeps its mode; a new one gets
    ``0o666 & ~umask``, like any file a program creates. Anything that is not a
    regular file (a directory, a device, a FIFO, a socket) is refused with an
    :class:`~turnrl.errors.OutputError` naming the path, instead of being replaced.
    """
    given = Path(path)
    target = Path(os.path.realpath(given)) if given.is_symlink() else given
    try:
        info = target.stat()
    except FileNotFoundError:
        return target, 0o666 & ~_current_umask()
    except OSError as err:
        raise OutputError(f"{given}: cannot write here ({err.strerror})") from err
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise OutputError(f"{given}: is {kind}; refusing to replace it")
    return target, stat.S_IMODE(info.st_mode)


def check_output_path(path: str | os.PathLike[str], *, option: str | None = None) -> Path:
    """Refuse, before any work, an output path a command could not write at the end.

    For a command's output option (``-o``), checked up front so a long computation is
    never lost to a typo: the path must not be a directory or a special file (see
    :func:`resolve_output`), its directory must exist (a command never invents
    directories for a single output file) and must take a new file there, which is
    tried by creating and removing an empty temporary file, so a read-only file
    system, a missing permission or a pseudo file system (``/proc``) are all found
    (``os.access`` would approve all of them for root). Raises
    :class:`~turnrl.errors.OutputError` whose message starts with ``option`` when
    given. Returns where the write will land.
    """
    label = f"{option} {path}" if option else str(path)
    try:
        target, _ = resolve_output(path)
    except OutputError as err:
        raise OutputError(f"{option} {err}" if option else str(err)) from None
    directory = target.parent
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise OutputError(f"{label}: the directory {directory} {what}")
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=TMP_SUFFIX)
    except OSError as err:
        raise OutputError(
            f"{label}: cannot create a file in {directory} ({err.strerror})"
        ) from None
    os.close(fd)
    os.unlink(probe)
    return target


# ---------------------------------------------------------------------------- write failures

WRITE_FAILURES = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOENT: "its directory no longer exists",
}
"""Causes of a failed write that lie in the destination, not in turnrl (exit code 2)."""


def write_failure(path: str | os.PathLike[str], exc: BaseException) -> OutputError | None:
    """An :class:`~turnrl.errors.OutputError` naming why writing ``path`` failed, when
    ``exc`` (or an exception it was raised from or during) is a destination problem
    (:data:`WRITE_FAILURES`); None for anything else (a bug keeps its traceback).

    Libraries that write files themselves hide the ``OSError``: ``torch.save`` raises a
    ``RuntimeError`` *during* handling it (``__context__``), ``safetensors`` a
    ``SafetensorError`` whose message quotes the system's text (``No space left on
    device``); both are recognised."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OutputError):
            return current
        if isinstance(current, OSError) and current.errno in WRITE_FAILURES:
            return OutputError(f"{path}: cannot write: {WRITE_FAILURES[current.errno]}")
        current = current.__cause__ or current.__context__
    text = str(exc)
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        if os.strerror(code) in text:
            return OutputError(f"{path}: cannot write: {WRITE_FAILURES[code]}")
    return None


@contextlib.contextmanager
def naming_write_failures(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn a destination problem raised inside (see :func:`write_failure`) into an
    :class:`~turnrl.errors.OutputError` about ``path``."""
    try:
        yield
    except OutputError:
        raise
    except Exception as exc:
        failure = write_failure(path, exc)
        if failure is None:
            raise
        raise failure from exc


@contextlib.contextmanager
def replace_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Write a directory of files (a saved model) at ``path`` all or nothing.

    An existing ``path`` is moved aside first, the body writes into ``path`` itself (so
    files that record their own absolute location stay right), and on success the old
    one is deleted. On failure the partial ``path`` is removed and the old one put
    back, and a destination problem is an :class:`~turnrl.errors.OutputError` naming
    it. Not atomic against ``kill -9`` (a partial directory may then remain), but never
    leaves a half-written one after an error.
    """
    target = Path(path)
    aside = target.with_name(f".{target.name}.old{TMP_SUFFIX}")
    with naming_write_failures(target):
        if aside.exists():
            shutil.rmtree(aside)
        if target.exists():
            os.replace(target, aside)
        try:
            target.mkdir(parents=True)
            yield target
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            if aside.exists():
                os.replace(aside, target)
            raise
        shutil.rmtree(aside, ignore_errors=True)
        _fsync_dir(target.parent)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Open a binary file for writing that appears at ``path`` only once complete.

    Yields a handle on a temporary file in the same directory; on normal exit the data
    is flushed, fsynced and moved over ``path``; on an exception the temporary file is
    removed and ``path`` is untouched. Use it to stream large payloads (e.g.
    ``torch.save(obj, handle)``) without holding a second copy in memory. Symlinks
    are written through and modes follow :func:`resolve_output`.
    """
    target, mode = resolve_output(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(
            dir=target.parent, prefix=f".{target.name}.", suffix=TMP_SUFFIX
        )
    except OSError as err:
        raise OutputError(f"{path}: cannot write here ({err.strerror})") from err
    try:
        with naming_write_failures(path):
            os.fchmod(fd, mode)
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
    line = json.dumps(obj, ensure_ascii=False, allow_nan=True)
    if "\n" in line:  # json.dumps escapes newlines; guard against surprises anyway
        raise ValueError(f"{target}: JSON line unexpectedly contains a newline")
    with naming_write_failures(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch(exist_ok=True)
        with open(target, "r+b", buffering=0) as handle:
            _truncate_partial_tail(handle)
            end = handle.seek(0, os.SEEK_END)
            try:
                data = memoryview(line.encode("utf-8") + b"\n")
                while data:
                    data = data[handle.write(data) :]
                os.fsync(handle.fileno())
            except OSError:  # the disk filled up mid-line: the file as it was
                with contextlib.suppress(OSError):
                    handle.truncate(end)
                raise


def read_jsonl_tolerant(path: str | os.PathLike[str]) -> list[Any]:
    """Read a JSONL file written by ``append_jsonl``, tolerating a crash-truncated tail.

    Blank lines are skipped. A final line that does not parse *and* is not terminated
    by a newline is the trace of an interrupted append: it is dropped. Any other line
    that does not parse raises an :class:`~turnrl.errors.InputError` (a ``ValueError``)
    naming the file and the 1-based line.
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
            raise InputError(str(source), index + 1, None, f"corrupt JSON line ({err})") from err
    return records


def truncate_jsonl_steps(path: str | os.PathLike[str], last_step: int) -> None:
    """Keep only the rows of a metrics log with ``step <= last_step``, atomically.

    Resuming from the checkpoint of ``last_step`` drops rows of unfinished steps
    (and a crash-truncated last line, see :func:`read_jsonl_tolerant`).
    """
    kept = [row for row in read_jsonl_tolerant(path) if row["step"] <= last_step]
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in kept))
