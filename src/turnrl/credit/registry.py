"""Estimators registered by name (never an if/elif chain over a string flag).

An estimator is a pure function ``(table, **params) -> Credit``. Registering it
makes it available to ``compute_advantages``, the CLI, the audit and every
adapter at once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from turnrl.errors import ParameterError, UsageError
from turnrl.options import check_options
from turnrl.table import TurnTable


@dataclass(frozen=True)
class Credit:
    """What an estimator returns, aligned with the table's rows (input order)."""

    advantages: np.ndarray
    """float64, shape (n_rows,)."""
    clip_factor: np.ndarray | None = None
    """Per-row multiplier of the PPO clip range (A2TGPO), or None."""


EstimatorFn = Callable[..., Credit]


@dataclass(frozen=True)
class Estimator:
    name: str
    fn: EstimatorFn
    group_key: str
    """Which group key of the design table the estimator normalises within."""
    summary: str
    needs: tuple[str, ...] = ()
    """Optional turn-record fields the estimator reads, which a trainer must fill in
    before credit (``("info_gain",)`` for the IG estimators, ``("q",)`` for ``q``)."""
    scale: str = "std"
    """How its default advantages are scaled: ``"std"`` (divided by a group std) or
    ``"mean"`` (a mean-only baseline); the audit compares it with the exact ``node``
    baseline of the same scale."""

    def params(self) -> dict[str, object]:
        """Keyword options and their defaults."""
        signature = inspect.signature(self.fn)
        return {
            name: p.default
            for name, p in signature.parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        }


SCALES = ("std", "mean")
"""The values of ``Estimator.scale``."""

_REGISTRY: dict[str, Estimator] = {}
_ALIASES: dict[str, str] = {}


def register_estimator(
    name: str,
    *,
    group_key: str,
    aliases: tuple[str, ...] = (),
    needs: tuple[str, ...] = (),
    scale: str = "std",
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator: register ``fn(table, *, **params) -> Credit`` under ``name``.

    ``needs`` names the optional record fields it reads (e.g. ``("info_gain",)``),
    so trainers know what to compute before calling it and the audit skips it on a
    log without them; ``scale`` says whether its default advantages are divided by a
    std (``"std"``) or mean-only (``"mean"``). Both are read, never hard-coded, by
    whoever needs them (:mod:`turnrl.credit.audit`, the trainers, ``validate``).
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}; got {scale!r}")

    def decorate(fn: EstimatorFn) -> EstimatorFn:
        if name in _REGISTRY or name in _ALIASES:
            raise ValueError(f"estimator {name!r} is already registered")
        summary = (inspect.getdoc(fn) or "").split("\n", 1)[0]
        _REGISTRY[name] = Estimator(name, fn, group_key, summary, tuple(needs), scale)
        for alias in aliases:
            _ALIASES[alias] = name
        return fn

    return decorate


def get_estimator(name: str) -> Estimator:
    """Look up an estimator by name or alias; unknown names list the known ones."""
    canonical = _ALIASES.get(name, name)
    if canonical not in _REGISTRY:
        known = ", ".join(list_estimators())
        raise UsageError(f"unknown estimator {name!r}; known: {known}")
    return _REGISTRY[canonical]


def list_estimators(*, with_aliases: bool = False) -> list[str]:
    names = sorted(_REGISTRY)
    return sorted([*names, *_ALIASES]) if with_aliases else names


def check_params(estimator: str, params: Mapping[str, object]) -> list[tuple[str, str]]:
    """Problems of ``params`` for ``estimator``: ``(name, problem)`` for every unknown
    parameter (the problem lists the allowed ones) and every value of the wrong type."""
    return check_options(get_estimator(estimator).fn, params, skip=1)


def compute_credit(table: TurnTable, estimator: str, **params: object) -> Credit:
    """Run an estimator; unknown parameters and values of the wrong type are a
    :class:`~turnrl.errors.ParameterError` (a ``TypeError``) naming the parameter
    and what it takes."""
    entry = get_estimator(estimator)
    allowed = entry.params()
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ParameterError(
            f"estimator {entry.name!r} has no parameter(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(f'{k}={v!r}' for k, v in allowed.items()) or 'none'}"
        )
    problems = check_params(entry.name, params)
    if problems:
        raise ParameterError(
            f"estimator {entry.name!r}: "
            + "; ".join(f"parameter {name!r}: {problem}" for name, problem in problems)
        )
    credit = entry.fn(table, **params)
    advantages = np.asarray(credit.advantages, dtype=np.float64)
    if advantages.shape != (table.n_rows,):
        raise AssertionError(f"estimator {entry.name!r} returned shape {advantages.shape}")
    return Credit(advantages, credit.clip_factor)


def compute_advantages(table: TurnTable, estimator: str, **params: object) -> np.ndarray:
    """One float64 advantage per row of ``table``, in input row order."""
    return compute_credit(table, estimator, **params).advantages
