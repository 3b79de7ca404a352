"""Errors that point at the exact place of bad input (file, line, field)."""

from __future__ import annotations


class TurnRecordError(ValueError):
    """A turn record (or a set of them) is invalid.

    The message always names where: ``SOURCE:LINE: field 'NAME': what is wrong``.
    ``source`` is a file path or ``"<records>"`` for in-memory input, ``line`` is
    1-based (the JSONL line, or the position in the iterable), ``field`` may be
    ``None`` when the problem is the whole line (e.g. malformed JSON).
    """

    def __init__(self, source: str, line: int | None, field: str | None, problem: str) -> None:
        self.source = source
        self.line = line
        self.field = field
        self.problem = problem
        where = source if line is None else f"{source}:{line}"
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{problem}")
