"""Strict JSON-lines reading: every value exactly as written, or an error naming
file, line and field.

Reading (:func:`iter_jsonl`, :func:`parse_json_line`): one JSON value per line,
refused with an :class:`~turnrl.errors.InputError` naming the file, the 1-based
line and the field (a path such as ``prompt[2].content``) when a line has

* bytes that are not UTF-8, or a string with a lone surrogate escape (``"\\ud800"``),
  in any string, keys and ids included;
* a key twice in one object;
* an integer outside the signed 64-bit range, or a number that overflows a
  float (``1e400``, a 401-digit integer);
* ``NaN``/``Infinity`` (unless the caller allows them: the metrics logs do);
* nesting deeper than the parser can follow; anything else that is not JSON.

Nothing is guessed: a value that cannot be represented exactly is an error, not
a rounded number.

Re-exported by :mod:`turnrl.io` (its readers and writers are one face for callers).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from turnrl.errors import InputError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class _Flagged:
    """A value the strict parser refuses; kept in the tree so its path can be named."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem


class _DuplicateKeys(dict):
    """An object that had a key twice (the hook keeps parsing to name the path)."""

    key = ""
    problem = "appears twice in one object"


_SUSPECT = re.compile(rb"\\u[dD][89a-fA-F]|[0-9]{19}|[eE]\+?[0-9]{3}")
"""What a line needs before a value in it can be a lone surrogate, an integer beyond
64 bits or a float overflow; only such lines are searched value by value."""


def _path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def _find(value: Any, test: Callable[[Any], str | None], path: str = "") -> tuple[str, str] | None:
    """Depth-first: ``(path, problem)`` of the first value (or key) ``test`` objects to.

    An object with a duplicate key is reported at the key's path."""
    problem = test(value)
    if problem is not None:
        if isinstance(value, _DuplicateKeys):
            return _path(path, value.key), problem
        return path, problem
    if isinstance(value, dict):
        for key, item in value.items():
            problem = test(key)
            if problem is not None:
                return _path(path, key.encode("utf-8", "backslashreplace").decode()), problem
            found = _find(item, test, _path(path, key))
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _find(item, test, _path(path, index))
            if found is not None:
                return found
    return None


def _refused(value: Any) -> str | None:
    """Why the strict reader refuses ``value`` itself (not its items), or ``None``."""
    if isinstance(value, _Flagged | _DuplicateKeys):
        return value.problem
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if INT64_MIN <= value <= INT64_MAX:
            return None
        text = str(value) if abs(value) < 10**24 else f"of {len(str(abs(value)))} digits"
        return f"integer {text} does not fit in 64 bits"
    if isinstance(value, float):
        return None if math.isfinite(value) else "number overflows a 64-bit float"
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            return f"has a lone surrogate \\u{ord(value[err.start]):04x} (not a Unicode character)"
    return None


class _StrictDecoder(json.JSONDecoder):
    """The standard library's decoder, with hooks that flag duplicate keys and
    (unless allowed) ``NaN``/``Infinity`` instead of accepting them silently."""

    def __init__(self, allow_nan: bool) -> None:
        self.flagged = False
        super().__init__(
            object_pairs_hook=self._object,
            parse_constant=None if allow_nan else self._constant,
        )

    def _object(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) == len(pairs):
            return out
        seen: set[str] = set()
        self.flagged = True
        flagged = _DuplicateKeys(out)
        flagged.key = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        return flagged

    def _constant(self, text: str) -> Any:
        self.flagged = True
        return _Flagged(f"{text} is not a JSON number")


def parse_json_line(
    data: bytes | str,
    *,
    source: str,
    line: int,
    allow_nan: bool = False,
    error: type[InputError] = InputError,
) -> Any:
    """Parse one line of JSON strictly (see the module docstring) or raise ``error``.

    ``error`` is raised as ``error(source, line, field, problem)``, with ``field`` the
    path of the offending value (``None`` when the line is not JSON at all).
    """
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            problem = f"is not UTF-8 (byte {err.start + 1} of the line)"
            raise error(source, line, _undecodable_field(data), problem) from None
        raw = data
    else:
        text = data
        raw = data.encode("utf-8", "surrogatepass")
    decoder = _StrictDecoder(allow_nan)
    try:
        value, end = decoder.raw_decode(text, _skip_space(text, 0))
    except json.JSONDecodeError as err:
        raise error(
            source, line, None, f"malformed JSON ({err.msg} at column {err.colno})"
        ) from None
    except RecursionError:
        raise error(source, line, None, "JSON nested too deeply for the parser") from None
    if _skip_space(text, end) != len(text):
        raise error(source, line, None, f"malformed JSON (extra data at column {end + 1})")
    if decoder.flagged or _SUSPECT.search(raw):
        found = _find(value, _refused)
        if found is not None:
            raise error(source, line, found[0] or None, found[1])
    return value


def _undecodable_field(data: bytes) -> str | None:
    """Path of the first key or string holding bytes that are not UTF-8 (``None`` when
    the line is not JSON either): each such byte is decoded as a lone surrogate
    (``surrogateescape``) and searched for as one."""
    try:
        value = json.loads(data.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError):
        return None

    def escaped(item: Any) -> str | None:
        if isinstance(item, str) and any("\udc80" <= c <= "\udcff" for c in item):
            return "not UTF-8"
        return None

    found = _find(value, escaped)
    return found[0] or None if found is not None else None


def _skip_space(text: str, start: int) -> int:
    """Index of the first non-whitespace character at or after ``start``."""
    while start < len(text) and text[start] in " \t\r\n":
        start += 1
    return start


def open_input(path: str | os.PathLike[str], *, error: type[InputError] = InputError) -> BinaryIO:
    """Open a file for reading in binary mode, or raise ``error`` saying why not."""
    source = str(path)
    if os.path.isdir(path):
        raise error(source, None, None, "is a directory, not a file")
    try:
        return open(path, "rb")
    except OSError as exc:
        raise error(source, None, None, f"cannot read file: {exc.strerror}") from None


def iter_jsonl(
    path: str | os.PathLike[str],
    *,
    allow_nan: bool = False,
    error: type[InputError] = InputError,
) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, value)`` for each non-blank line of a JSONL file, strictly.

    Line numbers are 1-based and count blank lines. Errors are raised as ``error``
    (see :func:`parse_json_line`); a file that cannot be opened also raises it.
    """
    source = str(path)
    with open_input(path, error=error) as handle:
        for number, raw in enumerate(handle, start=1):
            if raw.strip():
                yield (
                    number,
                    parse_json_line(
                        raw, source=source, line=number, allow_nan=allow_nan, error=error
                    ),
                )
