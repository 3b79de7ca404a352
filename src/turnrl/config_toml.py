"""Typed configs read from TOML: dataclasses in, clear errors (file, line, field) out.

The generic machinery under every turnrl config (``RunConfig`` of ``turnrl train``,
``IterateConfig`` of ``turnrl iterate``): nothing here knows a section.

Every config class is a plain ``@dataclass`` whose fields each carry an *attribute
docstring* (a string literal right below the field, cleanrl ``Args`` style). Those
docstrings are read back from the source with ``ast``, so ``describe_config`` can list
every option with its meaning and ``config_to_toml_text`` can write a self-documenting
copy of the config into the run directory.

TOML layout: scalar fields of the top-level class are top-level keys; a field whose type
is itself a config dataclass is a ``[section]`` table (nesting to any depth as
``[a.b]``). Overrides are ``section.field=value`` strings; the value is parsed as a TOML
value (``3``, ``0.5``, ``true``, ``[1, 2]``, ``{a = 1}``, ``"text"``) and then checked
against the field's type; for ``str`` fields an unquoted value is taken verbatim, and
``none``/``null`` sets an optional field to ``None``. A path may reach into a ``dict``
field (``credit.params.beta=0.1``).

Modes: a top-level class whose runs come in modes (``RunConfig``: a built-in
environment or an ``[agent]`` program) defines ``inactive_sections()``, the section
fields its mode does not read, each with the reason. ``load_config`` refuses a file
section or an override that sets one (naming the file and line, or the override, and
the field), and ``config_to_toml_text`` leaves them out, so a saved config holds only
what its run reads.

TOML has no null: ``config_to_toml_text`` writes a ``None`` value as a comment, so a
round trip is exact only when optional fields default to ``None`` (all here do).

Why no library (pydantic 2, cattrs, msgspec, all well kept): the values are checked by
:func:`turnrl.options.coerce`, the same rules (and the same messages, e.g. "expected a
64-bit integer") that check the option tables of estimators, strategies and
environments against their signatures; the errors must name the TOML file's *line*,
which none of them knows (they see a dict, not the text), and the field docstrings
that ``describe_config`` and the saved ``config.toml`` show are attribute docstrings,
which none of them reads. What is left to write is about 300 lines, here.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import json
import math
import re
import textwrap
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from turnrl.errors import ConfigError
from turnrl.options import TypeMismatch, Unsupported, coerce, type_name

T = TypeVar("T")

# --------------------------------------------------------------------------- docstrings


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass (and its dataclass bases), by field name.

    Read from the source with ``ast``: a string-literal statement directly after an
    annotated assignment documents that field. Empty when the source is unavailable.
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        class_def = ast.parse(source).body[0]
        if not isinstance(class_def, ast.ClassDef):
            continue
        body = class_def.body
        for stmt, nxt in itertools.pairwise(body):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def describe_config(cls: type, prefix: str = "") -> str:
    """Every field of ``cls`` (recursively), one block each: dotted name, type, default
    and docstring. Meant for ``--help``-style listings."""
    lines: list[str] = []
    docs = field_docs(cls)
    defaults = cls()
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        tp = _hints(cls)[f.name]
        if _is_config_class(tp):
            lines.append(f"[{name}]  {inspect.cleandoc(tp.__doc__ or '')}".rstrip())
            lines.append(describe_config(tp, prefix=f"{name}."))
            continue
        default = getattr(defaults, f.name)
        lines.append(f"{name}: {type_name(tp)} = {default!r}")
        doc = docs.get(f.name, "")
        if doc:
            lines.extend("    " + line for line in doc.splitlines())
    return "\n".join(lines)


# --------------------------------------------------------------------------- type checking


def _is_config_class(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _is_optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in (
        typing.get_args(tp)
    )


def _coerce(value: Any, tp: Any) -> Any:
    """``value`` as field type ``tp`` (see :func:`turnrl.options.coerce`), or raise
    ``TypeMismatch``; a field type the checker does not support is one too."""
    try:
        return coerce(value, tp)
    except Unsupported as err:
        raise TypeMismatch(str(err)) from None


# --------------------------------------------------------------------------- TOML loading

_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")


def _key_line(text: str, path: tuple[str, ...]) -> int | None:
    """Best-effort 1-based line of the dotted key ``path`` in TOML ``text`` (or of the
    ``[path]`` table header); None when not found (e.g. inline tables)."""
    table: tuple[str, ...] = ()
    for number, raw in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(raw)
        if header:
            table = tuple(part.strip().strip("\"'") for part in header.group(1).split("."))
            if table == path:
                return number
            continue
        if "=" not in raw:
            continue
        key = raw.split("=", 1)[0].strip()
        if not key or key.startswith("#"):
            continue
        full = table + tuple(part.strip().strip("\"'") for part in key.split("."))
        if full == path or full[: len(path)] == path:
            return number
    return None


class _Source:
    """Where values come from, for error messages."""

    def __init__(self, name: str, text: str | None = None) -> None:
        self.name = name
        self.text = text

    def error(self, path: tuple[str, ...], message: str) -> ConfigError:
        dotted = ".".join(path)
        line = _key_line(self.text, path) if self.text is not None else None
        where = f"{self.name}:{line}" if line is not None else self.name
        return ConfigError(f"{where}: {dotted}: {message}")


def _build(cls: type[T], data: dict[str, Any], path: tuple[str, ...], source: _Source) -> T:
    """Instantiate ``cls`` from a (TOML) dict; missing keys keep their defaults."""
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        key_path = (*path, key)
        if key not in names:
            raise source.error(
                key_path,
                f"unknown {'section' if isinstance(value, dict) else 'field'}"
                f" (known in {'.'.join(path) or 'top level'}: {', '.join(sorted(names))})",
            )
        tp = hints[key]
        if _is_config_class(tp):
            if not isinstance(value, dict):
                raise source.error(key_path, f"is a section; expected a table, got {value!r}")
            kwargs[key] = _build(tp, value, key_path, source)
            continue
        try:
            kwargs[key] = _coerce(value, tp)
        except TypeMismatch as err:
            raise source.error(key_path, str(err)) from None
    return cls(**kwargs)


def _parse_override_value(raw: str, tp: Any) -> Any:
    """Parse the text after ``=`` of an override, guided by the field type."""
    text = raw.strip()
    if text.lower() in ("none", "null") and (_is_optional(tp) or tp is Any):
        return None
    plain_str = tp is str or (_is_optional(tp) and str in typing.get_args(tp))
    if plain_str and not (len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'"):
        return text
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word: let the type check decide (fine for str / Any)


def _apply_override(config: Any, override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override {override!r}: expected section.field=value")
    dotted, raw = override.split("=", 1)
    path = tuple(part.strip() for part in dotted.strip().split("."))
    source = _Source(f"override {override!r}")
    target = config
    for depth, name in enumerate(path):
        here = path[: depth + 1]
        last = depth == len(path) - 1
        if isinstance(target, dict):  # inside a dict-typed field: free-form keys
            if last:
                target[name] = _parse_override_value(raw, Any)
                return
            target = target.setdefault(name, {})
            if not isinstance(target, dict):
                raise source.error(here, "is not a table")
            continue
        cls = type(target)
        names = [f.name for f in dataclasses.fields(target)]
        if name not in names:
            raise source.error(
                here, f"unknown field (known in {cls.__name__}: {', '.join(sorted(names))})"
            )
        tp = _hints(cls)[name]
        if last:
            if _is_config_class(tp):
                raise source.error(here, "is a section; override one of its fields")
            try:
                setattr(target, name, _coerce(_parse_override_value(raw, tp), tp))
            except TypeMismatch as err:
                raise source.error(here, str(err)) from None
            return
        value = getattr(target, name)
        if not (_is_config_class(tp) or isinstance(value, dict)):
            raise source.error(here, f"is a {type_name(tp)} field, not a section")
        target = value


def load_config(
    cls: type[T],
    toml_path: str | Path | None = None,
    overrides: typing.Iterable[str] = (),
    *,
    saved_copy: bool = False,
) -> T:
    """Build a ``cls`` config: defaults, then the TOML file (if any), then overrides.

    ``saved_copy``: the file is a run directory's own ``config.toml``, written by
    turnrl. Copies saved before runs had one mode hold every section, so there a
    section of the other mode that holds exactly its defaults is passed over (one
    with any other value is still refused): such a run still resumes.

    Raises ``ValueError`` naming the file (or the override), the dotted key, the line
    when it can be found, and what was wrong: unreadable file, unknown section/field,
    wrong type (a ``Literal`` field names its allowed values), TOML syntax error, a
    section the config's mode does not read (``inactive_sections``).
    """
    given: list[tuple[dict[str, Any], _Source]] = []  # what set values, for the mode check
    if toml_path is None:
        config = cls()
    else:
        path = Path(toml_path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            raise ConfigError(f"{path}: cannot read the config file: {reason}") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path}: invalid TOML: {err}") from None
        source = _Source(str(path), text)
        config = _build(cls, data, (), source)
        given.append((data, source))
    for override in overrides:
        _apply_override(config, override)
        given.append((_override_table(override), _Source(f"override {override!r}")))
    for data, source in given:  # the mode is known once every value is in
        _refuse_inactive(config, data, source, defaults_ok=saved_copy)
    return config


def inactive_sections(config: Any) -> dict[str, str]:
    """The section fields ``config``'s mode does not read, each with why (see the module
    docstring); empty for a config class without modes."""
    hook = getattr(config, "inactive_sections", None)
    return {} if hook is None else hook()


def _refuse_inactive(
    config: Any, data: dict[str, Any], source: _Source, *, defaults_ok: bool = False
) -> None:
    """Raise naming the first key of ``data`` (a TOML file's tables, or one override as a
    table) that sets a section ``config``'s mode does not read (``defaults_ok``: unless
    the section holds exactly its defaults)."""
    inactive = inactive_sections(config)
    for name, value in data.items():
        if name not in inactive:
            continue
        section = getattr(config, name)
        if defaults_ok and section == type(section)():
            continue
        first = next(iter(value), None) if isinstance(value, dict) else None
        path = (name,) if first is None else (name, first)
        raise source.error(path, inactive[name])


def _override_table(override: str) -> dict[str, Any]:
    """The nested table an override ``a.b.c=v`` sets (``{"a": {"b": {"c": None}}}``)."""
    dotted = override.split("=", 1)[0]
    table: dict[str, Any] = {}
    for part in reversed([p.strip() for p in dotted.strip().split(".")]):
        table = {part: table or None}
    return table


def config_origin(
    key: str, toml_path: str | Path | None, overrides: typing.Iterable[str] = ()
) -> str | None:
    """Where the value of dotted ``key`` came from, for error messages: the last
    override that set it (or a table above it), else ``file:line`` in the TOML file,
    else None (a default, or not found)."""
    path = tuple(key.replace("[", ".").split("."))
    for override in reversed(list(overrides)):
        dotted = override.split("=", 1)[0].strip()
        parts = tuple(part.strip() for part in dotted.split("."))
        if path[: len(parts)] == parts:
            return f"override {override!r}"
    if toml_path is None:
        return None
    try:
        text = Path(toml_path).read_text(encoding="utf-8")
    except OSError:
        return None
    # Down to the field (a key inside a table field such as ``credit.params`` is found
    # on the field's line), never to a bare section header.
    for depth in range(len(path), min(2, len(path)) - 1, -1):
        line = _key_line(text, path[:depth])
        if line is not None:
            return f"{toml_path}:{line}"
    return None


# --------------------------------------------------------------------------- saving


def config_to_dict(config: Any) -> dict[str, Any]:
    """Plain nested dict of a config (JSON-serialisable: paths become strings)."""

    def plain(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(dataclasses.asdict(config))


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, (str, Path)):
        # JSON string escapes are a subset of TOML basic-string escapes.
        return json.dumps(str(value), ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = ", ".join(f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as TOML")


def _comment(text: str) -> list[str]:
    return ["# " + line if line else "#" for line in text.splitlines()]


def config_to_toml_text(config: Any) -> str:
    """TOML text of ``config`` (field docstrings as comments) that ``load_config`` reads
    back to an equal config. ``None`` values are written as comments (TOML has no null);
    the sections its mode does not read (``inactive_sections``) are left out."""
    lines: list[str] = []

    def emit(obj: Any, path: tuple[str, ...]) -> None:
        cls = type(obj)
        docs = field_docs(cls)
        hints = _hints(cls)
        sections = []
        skipped = inactive_sections(obj) if not path else {}
        if path:
            if lines:
                lines.append("")
            lines.append("[" + ".".join(_toml_key(p) for p in path) + "]")
        for f in dataclasses.fields(obj):
            if _is_config_class(hints[f.name]):
                if f.name not in skipped:
                    sections.append(f.name)
                continue
            lines.extend(_comment(docs.get(f.name, "")))
            value = getattr(obj, f.name)
            if value is None:
                lines.append(f"# {_toml_key(f.name)} = (none)")
            else:
                lines.append(f"{_toml_key(f.name)} = {_toml_value(value)}")
        for name in sections:
            emit(getattr(obj, name), (*path, name))

    emit(config, ())
    return "\n".join(lines) + "\n"
