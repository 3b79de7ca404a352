"""The turn record: one JSON object per agent turn (the interchange format).

This module validates records field by field and reads JSONL files. It is pure
Python. Cross-record rules (unique ``(traj_id, turn)``, no gaps in turn numbers,
one task per trajectory) are checked by ``turnrl.table.TurnTable``, which sees all
rows at once. The format is documented in ``docs/turn-records.md``.

Unknown fields are kept untouched, so a record read and written back by
``turnrl credit`` loses nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from turnrl.errors import TurnRecordError

RECORD_FIELDS: tuple[str, ...] = (
    "task_id",
    "traj_id",
    "turn",
    "role",
    "prompt",
    "response",
    "prompt_ids",
    "response_ids",
    "logprobs",
    "reward",
    "done",
    "state_key",
    "node_id",
    "info_gain",
    "q",
)
"""The fields turnrl knows, in documentation order. Other fields pass through."""

REQUIRED_FIELDS: tuple[str, ...] = ("task_id", "traj_id", "turn")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class _Checker:
    """Raises ``TurnRecordError`` bound to one record's source and line."""

    def __init__(self, source: str, line: int) -> None:
        self.source = source
        self.line = line

    def fail(self, field: str | None, problem: str) -> TurnRecordError:
        return TurnRecordError(self.source, self.line, field, problem)

    def string(self, record: dict[str, Any], name: str, *, nullable: bool) -> str | None:
        value = record.get(name)
        if value is None:
            if nullable:
                return None
            raise self.fail(name, "is required (a non-empty string)")
        if not isinstance(value, str):
            raise self.fail(name, f"must be a string, got {type(value).__name__}")
        if not nullable and not value:
            raise self.fail(name, "must be a non-empty string")
        return value

    def finite(self, record: dict[str, Any], name: str, default: float | None) -> float | None:
        value = record.get(name, default)
        if value is None:
            return None
        if not _is_number(value):
            raise self.fail(name, f"must be a number, got {type(value).__name__}")
        value = float(value)
        if not math.isfinite(value):
            raise self.fail(name, f"must be finite, got {value}")
        return value

    def int_list(self, record: dict[str, Any], name: str) -> list[int] | None:
        value = record.get(name)
        if value is None:
            return None
        if not isinstance(value, list) or not all(_is_int(v) for v in value):
            raise self.fail(name, "must be a list of integers")
        return value

    def prompt(self, record: dict[str, Any]) -> str | list[dict[str, Any]] | None:
        value = record.get("prompt")
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise self.fail("prompt", "must be a string or a list of chat messages")
        for i, message in enumerate(value):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise self.fail("prompt", f"message {i} must be an object with a string 'role'")
        return value


def validate_record(obj: Any, *, source: str = "<records>", line: int = 1) -> dict[str, Any]:
    """Check one record and return it unchanged (a shallow copy).

    Defaults (``role="agent"``, ``reward=0``, ``done=false``, null optionals) are
    applied by the reader of the record (``TurnTable``), not written into it, so a
    record written back by ``turnrl credit`` has exactly the fields it came with.
    Raises ``TurnRecordError`` naming ``source``, ``line`` and the field.
    """
    check = _Checker(source, line)
    if not isinstance(obj, dict):
        raise check.fail(None, f"a turn record must be a JSON object, got {type(obj).__name__}")
    record = dict(obj)
    for name in ("task_id", "traj_id"):
        check.string(record, name, nullable=False)
    if "turn" not in record:
        raise check.fail("turn", "is required (an integer >= 0)")
    if not _is_int(record["turn"]) or record["turn"] < 0:
        raise check.fail("turn", f"must be an integer >= 0, got {record['turn']!r}")
    check.string(record, "role", nullable=True)
    check.prompt(record)
    if record.get("response") is not None:
        check.string(record, "response", nullable=True)
    for name in ("prompt_ids", "response_ids"):
        check.int_list(record, name)
    logprobs = record.get("logprobs")
    if logprobs is not None:
        if not isinstance(logprobs, list) or not all(
            _is_number(v) and math.isfinite(v) for v in logprobs
        ):
            raise check.fail("logprobs", "must be a list of finite numbers")
        ids = record.get("response_ids")
        if ids is not None and len(ids) != len(logprobs):
            raise check.fail(
                "logprobs", f"has {len(logprobs)} values but response_ids has {len(ids)} tokens"
            )
    check.finite(record, "reward", 0.0)
    done = record.get("done", False)
    if not isinstance(done, bool):
        raise check.fail("done", f"must be true or false, got {done!r}")
    for name in ("state_key", "node_id"):
        check.string(record, name, nullable=True)
    for name in ("info_gain", "q"):
        check.finite(record, name, None)
    return record


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, validated_record)`` for each non-blank line of a JSONL file.

    An empty file (no records) is an error: a silent empty result hides mistakes.
    """
    source = str(path)
    try:
        handle = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise TurnRecordError(source, None, None, f"cannot read file: {exc.strerror}") from exc
    count = 0
    with handle:
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TurnRecordError(
                    source, number, None, f"malformed JSON ({exc.msg} at column {exc.colno})"
                ) from exc
            count += 1
            yield number, validate_record(obj, source=source, line=number)
    if count == 0:
        raise TurnRecordError(source, None, None, "no turn records (the file is empty)")


def validate_records(
    records: Iterable[Any], *, source: str = "<records>"
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Validate in-memory records; line numbers are 1-based positions."""
    for number, obj in enumerate(records, start=1):
        yield number, validate_record(obj, source=source, line=number)


def dumps_record(record: dict[str, Any]) -> str:
    """One record as a compact JSON line (no trailing newline)."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
