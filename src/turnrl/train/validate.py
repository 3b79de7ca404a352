"""``validate(config)``: every config error of a run, found before any work or file.

One walk over the config tree (``RunConfig`` of ``turnrl train``, ``IterateConfig``
of ``turnrl iterate``, and any section a trainer adds): every field's value is
checked against its type hint (``Literal`` enums name their allowed values), then
each section's own ``check(problems)`` method runs: the checks live beside the fields
they check (:mod:`turnrl.train.config`, :mod:`turnrl.train.agent.config`,
:mod:`turnrl.train.iterate.config`); this module only walks and reports. Registered
names are resolved against their registries and their option tables against the
registered function's signature (estimators, rollout strategies, environments and
task generators), so a misspelt name or option, or a value of the wrong type, is
refused with the allowed ones named, not found after the warm start.

Every problem names its dotted key (``train.minibatch_size``); all problems of a
config are reported together in one :class:`~turnrl.errors.ConfigError` (its
``problems`` holds them as ``(dotted key, message)`` pairs), each located in the
TOML file (line) or the override it came from.

A section class checks itself with a method (a subclass extends it and calls
``super().check(p)``)::

    def check(self, p: Problems) -> None:
        p.at_least("concurrency", self.concurrency, 1)

Code that cannot edit a section class (a plugin, a test) adds a check from outside
with ``@register_check(SectionClass)``; it also runs on the class's subclasses. The
top-level class's check sees the whole config and reports keys relative to the top
(``rollout.tasks_per_step``).
"""

from __future__ import annotations

import dataclasses
import math
import typing
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from turnrl.config_toml import config_origin
from turnrl.errors import ConfigError
from turnrl.options import check_options, fits

__all__ = ["ConfigError", "Problems", "register_check", "validate"]

C = TypeVar("C")


class Problems:
    """Collects the problems of one section, keys prefixed with the section's path."""

    def __init__(self, prefix: str = "", found: list[tuple[str, str]] | None = None) -> None:
        self.prefix = prefix
        self.found: list[tuple[str, str]] = [] if found is None else found

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def add(self, name: str, message: str) -> None:
        """Report ``message`` about field ``name`` of this section."""
        self.found.append((self.key(name), message))

    def at_least(self, name: str, value: float, minimum: float) -> None:
        """``value >= minimum`` (NaN fails)."""
        if not value >= minimum:
            self.add(name, f"must be >= {minimum}, got {value!r}")

    def at_most(self, name: str, value: float, maximum: float, why: str = "") -> None:
        """``value <= maximum`` (NaN fails); ``why`` is said after the bound."""
        if not value <= maximum:
            self.add(name, f"must be <= {maximum!r}, got {value!r}{f' ({why})' if why else ''}")

    def above(self, name: str, value: float, minimum: float) -> None:
        """``value > minimum`` (NaN fails)."""
        if not value > minimum:
            self.add(name, f"must be > {minimum}, got {value!r}")

    def within(self, name: str, value: float, low: float, high: float) -> None:
        """``low <= value <= high`` (NaN fails)."""
        if not low <= value <= high:
            self.add(name, f"must be in [{low}, {high}], got {value!r}")

    def finite(self, name: str, value: float) -> None:
        if not math.isfinite(value):
            self.add(name, f"must be a finite number, got {value!r}")

    def one_of(self, name: str, value: Any, allowed: typing.Iterable[Any]) -> bool:
        """``value`` is one of ``allowed`` (listed in the message); returns whether."""
        options = list(allowed)
        if value in options:
            return True
        self.add(name, f"unknown {value!r}; allowed: {', '.join(map(str, options))}")
        return False

    def options(
        self, name: str, fn: Callable[..., Any], given: Mapping[str, Any], *, skip: int = 0
    ) -> None:
        """The option table ``given`` (field ``name``) fits ``fn``'s keyword options."""
        for option, message in check_options(fn, given, skip=skip):
            self.add(f"{name}.{option}", message)


Check = Callable[[Any, Problems], None]
_CHECKS: dict[type, list[Check]] = {}


def register_check(cls: type[C]) -> Callable[[Callable[[C, Problems], None]], Check]:
    """Decorator: run ``fn(section, problems)`` on every config section of class ``cls``
    (or a subclass) that ``validate`` meets, after the section's own ``check``."""

    def decorate(fn: Callable[[C, Problems], None]) -> Check:
        _CHECKS.setdefault(cls, []).append(fn)
        return fn

    return decorate


def validate(
    config: Any, *, toml_path: str | Path | None = None, overrides: Sequence[str] = ()
) -> None:
    """Raise :class:`ConfigError` listing every problem of ``config`` (nothing is done,
    nothing is written); return None when it can run.

    ``toml_path`` and ``overrides`` (what ``load_config`` built the config from) only
    serve the message: each problem is located in the file (line) or the override.
    First every field is checked against its type; only a well-typed config gets the
    section checks (they compare and look up values).
    """
    problems: list[tuple[str, str]] = []
    _check_types(config, "", problems)
    if not problems:
        _run_checks(config, "", problems)
    if problems:
        where = {}
        for key, _ in problems:
            origin = config_origin(key, toml_path, overrides)
            if origin is not None:
                where[key] = origin
        raise ConfigError.from_problems(problems, where)


def _sections(section: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """``(prefix, section)`` of ``section`` and every config section nested in it."""
    yield prefix, section
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _sections(value, f"{prefix}{f.name}.")


def _check_types(config: Any, prefix: str, problems: list[tuple[str, str]]) -> None:
    for path, section in _sections(config, prefix):
        hints = typing.get_type_hints(type(section))
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                continue
            why = fits(value, hints[f.name])
            if why is not None:
                problems.append((f"{path}{f.name}", why))
                continue
            bad_text = _text_problem(value, plain=True)
            if bad_text is not None:
                problems.append((f"{path}{f.name}{bad_text[0]}", bad_text[1]))


def _text_problem(value: Any, *, plain: bool) -> tuple[str, str] | None:
    """Where (a key suffix: ``.name``, ``[2]``) and why a string of the config cannot be
    used, or None.

    Every string, also inside lists and tables, must be valid UTF-8 (a byte that is not,
    from the command line, arrives as a lone surrogate) and hold no DEL: the saved
    ``config.toml`` could hold neither, so the run would train and then never resume. A
    plain string field (``run_dir``, ``label``, ``policy.model``...) holds no control
    character at all: it names a file, a run or a model, and a report or a terminal
    would show it garbled.
    """
    if isinstance(value, Mapping | list | tuple):
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        for key, item in items:
            where = f".{key}" if isinstance(value, Mapping) else f"[{key}]"
            found = _text_problem(key, plain=False) or _text_problem(item, plain=False)
            if found is not None:
                return where + found[0], found[1]
        return None
    if not isinstance(value, str):
        return None
    for position, char in enumerate(value):
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: an undecodable byte
            why = f"is not valid UTF-8 (byte 0x{code - 0xDC00:02x} at character {position})"
        elif 0xD800 <= code <= 0xDFFF:
            why = f"holds a lone surrogate \\u{code:04x} at character {position}"
        elif code == 0x7F or (plain and unicodedata.category(char) == "Cc"):
            why = f"holds the control character U+{code:04X} at character {position}"
        else:
            continue
        return "", why
    return None


def _run_checks(config: Any, prefix: str, problems: list[tuple[str, str]]) -> None:
    for path, section in _sections(config, prefix):
        own = getattr(section, "check", None)
        if callable(own):
            own(Problems(path, problems))
        for cls in type(section).__mro__:
            for check in _CHECKS.get(cls, []):
                check(section, Problems(path, problems))
