"""Decoding request bodies: JSON whose integers are bounded and whose strings are text,
errors that name the field.

Python's ``json`` turns any integer literal into an ``int`` (up to 4300 digits,
then a ``ValueError``), and a 400-digit reward then fails far from the parser
(``float()`` overflows), as an internal error. Here integer literals longer than
:data:`MAX_INT_CHARS` characters (more than any 64-bit value needs) are kept as
:class:`HugeInt` markers, and :func:`decode_json` refuses the body with a 400
naming the first such field as a JSON path (``messages[0].content[1].n``).
Floats too large for a double decode as infinity and are refused by the
field's own finiteness check. A JSON ``\\ud800`` escape decodes to a lone
surrogate, which is not text (no tokenizer, no UTF-8 records file takes it):
refused here too, with the field's path (``messages[0].content``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from turnrl.serve.errors import bad_request

MAX_INT_CHARS = 20
"""Longest integer literal accepted (sign included): every int64 and uint64 fits."""


@dataclass(frozen=True)
class HugeInt:
    """Stands for an integer literal too long to be any number the gateway uses."""

    chars: int


def _parse_int(text: str) -> int | HugeInt:
    return int(text) if len(text) <= MAX_INT_CHARS else HugeInt(len(text))


def _child_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _is_text(value: str) -> bool:
    """Whether ``value`` is valid Unicode text (no lone surrogate such as ``"\\ud800"``,
    which JSON escapes allow and no tokenizer or UTF-8 file accepts)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _surrogate_at(value: str) -> int:
    return next(i for i, c in enumerate(value) if "\ud800" <= c <= "\udfff")


def find_bad_value(obj: Any) -> tuple[str, str] | None:
    """The JSON path of the first value no field can hold (depth first) and why: an
    integer literal too long (:class:`HugeInt`) or a string (or key) with a lone
    surrogate."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, HugeInt):
            return path, (
                f"an integer of {value.chars} characters is out of range (at most {MAX_INT_CHARS})"
            )
        if isinstance(value, str):
            if not _is_text(value):
                at = _surrogate_at(value)
                return path, (
                    f"a lone surrogate (U+{ord(value[at]):04X}) at character {at} is not text; "
                    "send valid UTF-8 (a surrogate pair only as two halves of one character)"
                )
            continue
        if isinstance(value, dict):
            for key in value:
                if not _is_text(key):
                    return path or "the body", f"a key holds a lone surrogate: {key!r}"
            items: list[tuple[str | int, Any]] = list(value.items())
        elif isinstance(value, list):
            items = list(enumerate(value))
        else:
            continue
        stack.extend((_child_path(path, key), child) for key, child in reversed(items))
    return None


def decode_json(raw: bytes | bytearray) -> Any:
    """The decoded body; 400 when it is empty, not JSON, too deep, or holds a value no
    field can hold (a huge integer, a lone surrogate), naming its JSON path."""
    if not raw.strip():
        raise bad_request("the request body is empty; send a JSON object")
    try:
        obj = json.loads(raw, parse_int=_parse_int)
    except json.JSONDecodeError as exc:
        raise bad_request(
            f"invalid JSON body: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from exc
    except (UnicodeDecodeError, RecursionError) as exc:
        raise bad_request(f"invalid JSON body: {type(exc).__name__}") from exc
    found = find_bad_value(obj)
    if found is not None:
        path, why = found
        raise bad_request(f"{path or 'the body'}: {why}", path or None)
    return obj


def _strict_parse_int(text: str) -> int:
    if len(text) > MAX_INT_CHARS:
        raise ValueError(f"integer of {len(text)} characters")
    return int(text)


def loads_or_none(text: str) -> Any:
    """Decoded JSON, or ``None`` when ``text`` is not valid JSON with bounded integers
    (tool-call ``arguments``: an agent's or the model's text, kept raw when it does not parse)."""
    try:
        return json.loads(text, parse_int=_strict_parse_int)
    except (ValueError, RecursionError):
        return None
