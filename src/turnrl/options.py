"""Typed options: checking values against type hints and option tables against signatures.

Two users, one rule set (pure Python, usable from every layer):

* the typed config (:mod:`turnrl.train.config`) checks every TOML value and every
  override against its field's type hint (``coerce``);
* registries whose entries take keyword options (credit estimators, rollout
  strategies, environments and their task generators) check a user's option table
  against the function's signature (``check_options``): unknown names and wrong
  types are reported with the allowed options, before any work is done.

Supported hints: ``bool``, ``int``, ``float`` (an int widens; NaN and infinities are
refused: TOML and JSON can spell them, and no option means them; ``int`` is signed
64-bit: seeds and counts end up in torch and numpy), ``str``, ``Path``,
``Literal[...]``, optional and union types, ``list[...]``/``tuple[...]``,
``dict[str, ...]`` and ``Any``. A hint this module cannot check (a ``Sequence`` of
tools, a callable, a class) accepts any value: the check must never refuse an option
the function would take.
"""

from __future__ import annotations

import inspect
import math
import numbers
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal


class TypeMismatch(Exception):
    """A value does not fit a type hint (the message says what was expected)."""


class Unsupported(Exception):
    """A type hint this module cannot check."""


def type_name(tp: Any) -> str:
    """Readable name of a type hint (``int``, ``list[str]``, ``'k1' | 'k2'``)."""
    if typing.get_origin(tp) is Literal:
        return " | ".join(repr(v) for v in typing.get_args(tp))
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "")


def coerce(value: Any, tp: Any) -> Any:
    """``value`` as type ``tp`` (int -> float widening, list -> tuple), or raise.

    Raises ``TypeMismatch`` (the message names what was expected and what came) or
    ``Unsupported`` for hints outside the supported set.
    """
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if any(value == option and type(value) is type(option) for option in allowed):
            return value
        raise TypeMismatch(f"expected one of {', '.join(map(repr, allowed))}; got {value!r}")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        for option in typing.get_args(tp):
            if option is type(None):
                continue
            try:
                return coerce(value, option)
            except TypeMismatch:
                pass
        raise TypeMismatch(f"expected {type_name(tp)}, got {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise TypeMismatch(f"expected a list ({type_name(tp)}), got {value!r}")
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        item_tp = args[0] if args else Any
        items = [coerce(item, item_tp) for item in value]
        return items if origin is list else tuple(items)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise TypeMismatch(f"expected a table ({type_name(tp)}), got {value!r}")
        args = typing.get_args(tp)
        value_tp = args[1] if len(args) == 2 else Any
        return {str(k): coerce(v, value_tp) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise TypeMismatch(f"expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if -(2**63) <= value < 2**63:
                return value
            raise TypeMismatch(
                f"expected a 64-bit integer, got an integer of {len(str(abs(value)))} digits"
            )
        raise TypeMismatch(f"expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:
                number = math.inf
            if not math.isfinite(number):
                shown = (
                    repr(value)
                    if len(repr(value)) <= 40
                    else f"an integer of {len(str(value))} digits"
                )
                raise TypeMismatch(f"expected a finite number, got {shown}")
            return number
        raise TypeMismatch(f"expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise TypeMismatch(f"expected a string, got {value!r}")
    if tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        raise TypeMismatch(f"expected a path string, got {value!r}")
    raise Unsupported(f"unsupported type {type_name(tp)}")


def fits(value: Any, tp: Any) -> str | None:
    """Why ``value`` does not fit ``tp`` (``None``: it fits, or ``tp`` is not checkable)."""
    try:
        coerce(value, tp)
    except TypeMismatch as err:
        return str(err)
    except Unsupported:
        return None
    return None


def is_real(value: Any) -> bool:
    """A real number an agent may hand over: an int, a float, or any other
    ``numbers.Real`` (NumPy's ``float32``, ``float64``, ``int64``... scalars, a
    ``Fraction``); not a bool (Python's or NumPy's) and not a string."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def finite_real(value: Any) -> float | None:
    """``value`` as a float when it is a finite real number (:func:`is_real`), else
    ``None`` (also for an integer too large for a float)."""
    if not is_real(value):
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError):
        return None
    return number if math.isfinite(number) else None


_OPTION_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def keyword_options(fn: Callable[..., Any], *, skip: int = 0) -> dict[str, inspect.Parameter]:
    """The parameters of ``fn`` a caller may pass by name, after the first ``skip``
    positional ones (e.g. a strategy's context, tasks and group size)."""
    params = list(inspect.signature(fn).parameters.values())
    positional = [p for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    skipped = {p.name for p in positional[:skip]}
    return {p.name: p for p in params if p.kind in _OPTION_KINDS and p.name not in skipped}


def accepts_any_keyword(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes ``**kwargs`` (then any option name is allowed)."""
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(fn).parameters.values()
    )


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """Resolved type hints of ``fn`` (of ``__init__`` for a class); {} when unresolvable."""
    target = fn.__init__ if isinstance(fn, type) else fn  # type: ignore[misc]
    try:
        return typing.get_type_hints(target)
    except Exception:  # forward references only importable under TYPE_CHECKING, etc.
        return {}


def describe_options(fn: Callable[..., Any], *, skip: int = 0) -> str:
    """``name=default`` of each option (``name`` alone when required or when the default
    is not a plain value), or ``none``."""
    parts = []
    for name, p in keyword_options(fn, skip=skip).items():
        plain = p.default is None or isinstance(p.default, (bool, int, float, str))
        parts.append(f"{name}={p.default!r}" if plain else name)
    return ", ".join(parts) or "none"


def check_options(
    fn: Callable[..., Any], options: Mapping[str, Any], *, skip: int = 0
) -> list[tuple[str, str]]:
    """Problems of calling ``fn`` with keyword ``options``: ``(option name, problem)``.

    Unknown names (unless ``fn`` takes ``**kwargs``; the problem lists the allowed
    options) and values that do not fit the parameter's type hint. Empty when the
    options are fine.
    """
    allowed = keyword_options(fn, skip=skip)
    hints = _hints(fn)
    problems: list[tuple[str, str]] = []
    for name, value in options.items():
        if name not in allowed:
            if not accepts_any_keyword(fn):
                problems.append(
                    (name, f"unknown option; allowed: {describe_options(fn, skip=skip)}")
                )
            continue
        if name in hints:
            why = fits(value, hints[name])
            if why is not None:
                problems.append((name, why))
    return problems
