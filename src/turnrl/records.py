"""The turn record on disk: JSON lines <-> :class:`~turnrl.types.TurnRecord`.

:func:`parse_record` reads one JSON object into a typed record and
:func:`check_record` validates a record field by field (both raise a
``TurnRecordError`` naming the source, the line and the field);
:func:`record_to_json` / :func:`dumps_record` write one back, with computed
columns such as ``advantage`` added at that moment (they are never stored in
the record). :func:`read_records` reads a whole file through the strict JSONL
reader of :mod:`turnrl.io`. Pure Python.

Cross-record rules (unique ``(traj_id, turn)``, no gaps in turn numbers, one task
per trajectory) are checked by ``turnrl.table.TurnTable``, which sees all rows at
once. The format is documented in ``docs/turn-records.md``.

Unknown keys are kept in ``TurnRecord.extra`` in their order and written back
unchanged, so reading and writing a file loses nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from turnrl.errors import TurnRecordError
from turnrl.io import INT64_MAX, INT64_MIN, atomic_open, iter_jsonl, open_input, parse_json_line
from turnrl.types import AglData, TurnRecord

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
"""The turn record's fields (docs/architecture.md, docs/turn-records.md), in documentation
order."""

REQUIRED_FIELDS: tuple[str, ...] = ("task_id", "traj_id", "turn")

NAMED_FIELDS: tuple[str, ...] = tuple(
    f.name for f in fields(TurnRecord) if f.name not in ("agl", "extra")
)
"""Every JSON key that maps to a ``TurnRecord`` field of the same name."""

AGL_KEYS: dict[str, str] = {
    "agl_reward": "reward",
    "agl_final_reward": "final_reward",
    "agl_response_id": "response_id",
    "agl_task": "task",
    "agl_metadata": "metadata",
}
"""JSON keys of ``TurnRecord.agl`` -> ``AglData`` fields."""

KNOWN_KEYS: frozenset[str] = frozenset(NAMED_FIELDS) | frozenset(AGL_KEYS)
"""Keys that never go to ``extra``."""

_SEQUENCES = ("prompt_ids", "response_ids", "logprobs", "tags")
_TRUE_BY_DEFAULT = ("train",)
_FALSE_BY_DEFAULT = ("pruned",)


# ------------------------------------------------------------------------- checking


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _surrogate(text: str) -> int | None:
    """Code point of a lone surrogate in ``text`` (not encodable as UTF-8), if any."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return ord(text[err.start])
    return None


class _Checker:
    """Raises ``TurnRecordError`` bound to one record's source and line."""

    def __init__(self, source: str, line: int) -> None:
        self.source = source
        self.line = line

    def fail(self, field: str | None, problem: str) -> TurnRecordError:
        return TurnRecordError(self.source, self.line, field, problem)

    def text(self, name: str, value: Any, *, nullable: bool, empty: bool = False) -> None:
        if value is None:
            if not nullable:
                raise self.fail(name, "is required (a non-empty string)")
            return
        if not isinstance(value, str):
            raise self.fail(name, f"must be a string, got {type(value).__name__}")
        if not value and not empty:
            raise self.fail(name, "must be a non-empty string")
        code = _surrogate(value)
        if code is not None:
            raise self.fail(name, f"has a lone surrogate \\u{code:04x} (not a Unicode character)")

    def integer(self, name: str, value: Any, *, nullable: bool, minimum: int = INT64_MIN) -> None:
        if value is None and nullable:
            return
        if not _is_int(value) or not minimum <= value <= INT64_MAX:
            shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:20]}..."
            bound = "" if minimum == INT64_MIN else f" >= {minimum}"
            raise self.fail(name, f"must be a 64-bit integer{bound}, got {shown}")

    def finite(self, name: str, value: Any, *, nullable: bool) -> None:
        if value is None and nullable:
            return
        if not _is_number(value):
            raise self.fail(name, f"must be a number, got {type(value).__name__}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise self.fail(name, f"must be finite, got {value!r}"[:120])

    def flag(self, name: str, value: Any, *, nullable: bool) -> None:
        if value is None and nullable:
            return
        if not isinstance(value, bool):
            raise self.fail(name, f"must be true or false, got {value!r}")

    def ints(self, name: str, value: Any) -> None:
        if value is None:
            return
        if not isinstance(value, tuple) or not all(
            _is_int(v) and INT64_MIN <= v <= INT64_MAX for v in value
        ):
            raise self.fail(name, "must be a list of 64-bit integers")

    def prompt(self, value: Any) -> None:
        if value is None or isinstance(value, str):
            self.text("prompt", value, nullable=True, empty=True)
            return
        if not isinstance(value, tuple):
            raise self.fail("prompt", "must be a string or a list of chat messages")
        for i, message in enumerate(value):
            if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
                raise self.fail("prompt", f"message {i} must be an object with a string 'role'")
            for key, item in message.items():
                if isinstance(item, str):
                    self.text(f"prompt[{i}].{key}", item, nullable=False, empty=True)


def check_record(record: TurnRecord, *, source: str = "<records>", line: int = 1) -> TurnRecord:
    """Check every field of ``record``; return it. Raises ``TurnRecordError`` naming
    ``source``, ``line`` and the field (records built in code get the same checks as
    records read from a file: a NaN reward from an environment is caught here)."""
    check = _Checker(source, line)
    if not isinstance(record, TurnRecord):
        raise check.fail(None, f"expected a TurnRecord, got {type(record).__name__}")
    check.text("task_id", record.task_id, nullable=False)
    check.text("traj_id", record.traj_id, nullable=False)
    check.integer("turn", record.turn, nullable=False, minimum=0)
    check.text("role", record.role, nullable=False)
    check.prompt(record.prompt)
    check.text("response", record.response, nullable=True, empty=True)
    check.ints("prompt_ids", record.prompt_ids)
    check.ints("response_ids", record.response_ids)
    if record.logprobs is not None:
        if not isinstance(record.logprobs, tuple) or not all(
            _is_number(v) and math.isfinite(v) for v in record.logprobs
        ):
            raise check.fail("logprobs", "must be a list of finite numbers")
        ids = record.response_ids
        if ids is not None and len(ids) != len(record.logprobs):
            raise check.fail(
                "logprobs",
                f"has {len(record.logprobs)} values but response_ids has {len(ids)} tokens",
            )
    check.finite("reward", record.reward, nullable=False)
    check.flag("done", record.done, nullable=False)
    for name in ("state_key", "node_id", "stop_reason", "finish_reason", "copy_of"):
        check.text(name, getattr(record, name), nullable=True)
    for name in ("info_gain", "q", "temperature"):
        check.finite(name, getattr(record, name), nullable=True)
    for name in ("tool_call", "malformed", "context_rebuilt"):
        check.flag(name, getattr(record, name), nullable=True)
    for name in ("train", "pruned"):
        check.flag(name, getattr(record, name), nullable=False)
    check.integer("policy_version", record.policy_version, nullable=True)
    check.integer("persona", record.persona, nullable=True)
    check.integer("source_line", record.source_line, nullable=True, minimum=1)
    if record.tags is not None and (
        not isinstance(record.tags, tuple) or not all(isinstance(t, str) for t in record.tags)
    ):
        raise check.fail("tags", "must be a list of strings")
    if record.agl is not None:
        check.finite("agl_reward", record.agl.reward, nullable=True)
        check.finite("agl_final_reward", record.agl.final_reward, nullable=True)
        check.text("agl_response_id", record.agl.response_id, nullable=True)
        for name in ("task", "metadata"):
            value = getattr(record.agl, name)
            if value is not None and not isinstance(value, Mapping):
                raise check.fail(f"agl_{name}", f"must be an object, got {type(value).__name__}")
    clash = KNOWN_KEYS.intersection(record.extra)
    if clash:
        raise check.fail(min(clash), "is a named field and cannot also be in extra")
    return record


# -------------------------------------------------------------------------- parsing


def parse_record(obj: Any, *, source: str = "<records>", line: int = 1) -> TurnRecord:
    """One JSON object (a parsed line) as a checked ``TurnRecord``.

    Lists become tuples, integer rewards floats; ``role: null`` means the default
    ``"agent"``, and ``null`` in any other optional field means absent. Keys turnrl
    does not know go to ``extra`` unchanged. Raises ``TurnRecordError`` naming
    ``source``, ``line`` and the field.
    """
    check = _Checker(source, line)
    if not isinstance(obj, Mapping):
        raise check.fail(None, f"a turn record must be a JSON object, got {type(obj).__name__}")
    for name in REQUIRED_FIELDS:
        if obj.get(name) is None:
            kind = "an integer >= 0" if name == "turn" else "a non-empty string"
            raise check.fail(name, f"is required ({kind})")
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    agl: dict[str, Any] = {}
    for key, value in obj.items():
        if key in AGL_KEYS:
            agl[AGL_KEYS[key]] = value
        elif key not in KNOWN_KEYS:
            extra[key] = value
        elif value is None:
            if key in _TRUE_BY_DEFAULT + _FALSE_BY_DEFAULT + ("reward", "done"):
                raise check.fail(key, "must not be null")
        elif key in _SEQUENCES or key == "prompt":
            values[key] = tuple(value) if isinstance(value, list) else value
        elif key in ("reward", "info_gain", "q", "temperature") and _is_int(value):
            check.finite(key, value, nullable=False)
            values[key] = float(value)
        else:
            values[key] = value
    if agl:
        for name in ("reward", "final_reward"):
            if _is_int(agl.get(name)):
                check.finite(f"agl_{name}", agl[name], nullable=False)
                agl[name] = float(agl[name])
        values["agl"] = AglData(**agl)
    try:
        record = TurnRecord(**values, extra=extra)
    except TypeError as err:  # a value the record's __post_init__ cannot take
        raise check.fail(None, f"cannot build a record: {err}") from None
    return check_record(record, source=source, line=line)


def as_record(obj: TurnRecord | Mapping[str, Any], *, source: str, line: int) -> TurnRecord:
    """A checked ``TurnRecord`` from a record or from a JSON-like mapping."""
    if isinstance(obj, TurnRecord):
        return check_record(obj, source=source, line=line)
    return parse_record(obj, source=source, line=line)


def validate_records(
    records: Iterable[TurnRecord | Mapping[str, Any]], *, source: str = "<records>"
) -> Iterator[tuple[int, TurnRecord]]:
    """Check in-memory records (typed, or JSON-like dicts); line numbers are 1-based
    positions."""
    for number, obj in enumerate(records, start=1):
        yield number, as_record(obj, source=source, line=number)


def iter_records(path: str | Path) -> Iterator[tuple[int, TurnRecord]]:
    """``(line_number, record)`` for each non-blank line of a JSONL file, strictly.

    An empty file (no records) is an error: a silent empty result hides mistakes.
    """
    source = str(path)
    count = 0
    for number, obj in iter_jsonl(path, error=TurnRecordError):
        count += 1
        yield number, parse_record(obj, source=source, line=number)
    if count == 0:
        raise TurnRecordError(source, None, None, "no turn records (the file is empty)")


def read_records(path: str | Path) -> list[TurnRecord]:
    """Every record of a JSONL file (see :func:`iter_records`)."""
    return [record for _, record in iter_records(path)]


# -------------------------------------------------------------------------- writing


def record_to_json(record: TurnRecord, columns: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON object of ``record``: the turn record's fields (docs/architecture.md) in
    documentation order, then the named optional fields that are set, then ``extra`` in
    its order, then ``columns`` (e.g. ``advantage``), which replace keys of ``extra`` of
    the same name.

    Left out: ``None`` fields, ``train`` when true, ``pruned`` when false. Tuples
    are written as lists.
    """
    out: dict[str, Any] = {}
    for name in NAMED_FIELDS:
        value = getattr(record, name)
        if value is None:
            continue
        if (name in _TRUE_BY_DEFAULT and value) or (name in _FALSE_BY_DEFAULT and not value):
            continue
        if name == "prompt" and isinstance(value, tuple):
            value = [dict(m) for m in value]
        elif isinstance(value, tuple):
            value = list(value)
        out[name] = value
    if record.agl is not None:
        out["agl_reward"] = record.agl.reward
        out["agl_final_reward"] = record.agl.final_reward
        for key in ("agl_response_id", "agl_task", "agl_metadata"):
            value = getattr(record.agl, AGL_KEYS[key])
            if value is not None:
                out[key] = value
    for key, value in record.extra.items():
        if columns is None or key not in columns:
            out[key] = value
    if columns:
        out.update(columns)
    return out


def dumps_record(record: TurnRecord, **columns: Any) -> str:
    """One record as a compact JSON line (no trailing newline); ``columns`` are extra
    keys computed for this line (``advantage=0.5``), see :func:`record_to_json`."""
    return json.dumps(
        record_to_json(record, columns),
        ensure_ascii=False,
        separators=(",", ":"),
        allow_nan=False,
    )


def _column_texts(values: Sequence[Any]) -> list[str]:
    """Each value as JSON text; finite floats by ``float.__repr__``, which is what
    ``json.dumps`` writes for them (without its per-call cost on a million rows)."""
    items = values.tolist() if hasattr(values, "tolist") else list(values)
    if all(type(v) is float for v in items) and all(math.isfinite(v) for v in items):
        return list(map(float.__repr__, items))
    return [json.dumps(v, allow_nan=False) for v in items]


def copy_with_columns(
    source: str | Path,
    target: str | Path,
    columns: Mapping[str, Sequence[Any]],
    *,
    rewrite: Sequence[bool] | None = None,
) -> int:
    """Copy the JSONL file ``source`` to ``target`` (atomically), the ``k``-th record
    line gaining the keys of ``columns`` with their ``k``-th values.

    A line is kept byte for byte and the keys are appended before its closing
    brace, in the line's own style (``", "`` when it separates keys that way). Lines
    flagged in ``rewrite`` already have one of the keys: they are parsed and
    written again with the values replaced in place. Blank lines are dropped.
    Returns the number of lines written. The line count must match the columns.
    """
    names = list(columns)
    n_rows = len(next(iter(columns.values()))) if columns else 0
    texts = [_column_texts(columns[name]) for name in names]
    # The appended keys, per style: compact (",", ":") or spaced (", ", ": ").
    keys = {
        spaced: [
            f"{', ' if spaced else ','}{json.dumps(name)}{': ' if spaced else ':'}".encode()
            for name in names
        ]
        for spaced in (False, True)
    }
    source_name = str(source)
    flags = rewrite.tolist() if hasattr(rewrite, "tolist") else rewrite  # numpy: no scalars
    rewritten = set() if flags is None else {i for i, flag in enumerate(flags) if flag}
    written = 0
    with open_input(source, error=TurnRecordError) as reader, atomic_open(target) as out:
        for number, raw in enumerate(reader, start=1):
            line = raw.strip()
            if not line:
                continue
            if written >= n_rows:
                raise TurnRecordError(source_name, number, None, "more lines than records")
            # The line's style, from its first key (a search of the whole line for
            # '": ' costs more than the rest of the copy).
            first = line.find(b'":')
            spaced = line[first + 2 : first + 3] == b" "
            if written in rewritten:
                obj = parse_json_line(line, source=source_name, line=number)
                obj.update(
                    {name: json.loads(t[written]) for name, t in zip(names, texts, strict=True)}
                )
                text = json.dumps(
                    obj,
                    ensure_ascii=False,
                    allow_nan=False,
                    separators=(", ", ": ") if spaced else (",", ":"),
                )
                out.write(text.encode("utf-8") + b"\n")
            elif len(texts) == 1:
                out.write(line[:-1] + keys[spaced][0] + texts[0][written].encode() + b"}\n")
            else:
                tail = b"".join(
                    key + t[written].encode() for key, t in zip(keys[spaced], texts, strict=True)
                )
                out.write(line[:-1] + tail + b"}\n")
            written += 1
    if written != n_rows:
        raise TurnRecordError(source_name, None, None, f"{written} lines for {n_rows} records")
    return written
