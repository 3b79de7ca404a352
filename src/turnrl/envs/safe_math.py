"""A safe arithmetic evaluator for the calculator tool.

The expression comes from model output, so it is never ``eval``ed: it is parsed
with :func:`ast.parse` (``mode="eval"``) and only a whitelist of nodes is walked
(int/float literals, ``+ - * / // % **``, unary ``+``/``-``, parentheses).
Everything else (names, calls, attributes, strings, comparisons...) is rejected
with a :class:`SafeMathError` that says what was found.

Work is bounded: the input length is capped, every intermediate value must stay
below :data:`MAX_ABS` in magnitude, and ``**`` only takes small integer exponents,
so inputs such as ``9**9**9`` fail fast instead of eating memory.

Integers stay exact. ``/`` returns an exact integer when the division is exact
(``12/4`` -> ``3``) and a float otherwise (``7/2`` -> ``3.5``).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

Number = int | float

MAX_LENGTH = 200
"""Longest accepted expression, in characters."""
MAX_ABS = 10**30
"""Largest accepted magnitude of any literal, intermediate value or result."""
MAX_EXPONENT = 64
"""Largest accepted absolute value of an exponent of ``**``."""


class SafeMathError(ValueError):
    """The expression is not a valid, bounded arithmetic expression."""


def _check(value: Number) -> Number:
    """Reject non-finite or too large values."""
    if isinstance(value, float) and not math.isfinite(value):
        raise SafeMathError("result is not a finite number")
    if abs(value) > MAX_ABS:
        raise SafeMathError(f"number too large (limit {MAX_ABS:.0e})")
    return value


def _true_div(a: Number, b: Number) -> Number:
    if b == 0:
        raise SafeMathError("division by zero")
    if isinstance(a, int) and isinstance(b, int) and a % b == 0:
        return a // b
    return a / b


def _floor_div(a: Number, b: Number) -> Number:
    if b == 0:
        raise SafeMathError("division by zero")
    return a // b


def _mod(a: Number, b: Number) -> Number:
    if b == 0:
        raise SafeMathError("modulo by zero")
    return a % b


def _pow(a: Number, b: Number) -> Number:
    if not isinstance(b, int):
        raise SafeMathError("exponent must be an integer")
    if abs(b) > MAX_EXPONENT:
        raise SafeMathError(f"exponent too large (limit {MAX_EXPONENT})")
    if a == 0 and b < 0:
        raise SafeMathError("division by zero")
    if b < 0:
        return _true_div(1, a**-b) if isinstance(a, int) else a**b
    return a**b


_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: _true_div,
    ast.FloorDiv: _floor_div,
    ast.Mod: _mod,
    ast.Pow: _pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _walk(node: ast.AST) -> Number:
    """Evaluate one whitelisted node."""
    if isinstance(node, ast.Constant):
        # bool is a subclass of int: exclude it explicitly (and complex, str...).
        if type(node.value) not in (int, float):
            raise SafeMathError(f"unsupported literal {node.value!r}")
        return _check(node.value)
    if isinstance(node, ast.BinOp):
        op = _BINARY.get(type(node.op))
        if op is None:
            raise SafeMathError(f"unsupported operator {type(node.op).__name__}")
        left, right = _walk(node.left), _walk(node.right)
        try:
            return _check(op(left, right))
        except (OverflowError, ZeroDivisionError) as exc:
            raise SafeMathError(str(exc)) from None
    if isinstance(node, ast.UnaryOp):
        uop = _UNARY.get(type(node.op))
        if uop is None:
            raise SafeMathError(f"unsupported operator {type(node.op).__name__}")
        return _check(uop(_walk(node.operand)))
    raise SafeMathError(f"unsupported syntax: {type(node).__name__}")


def evaluate(expression: str) -> Number:
    """Evaluate an arithmetic expression, or raise :class:`SafeMathError`.

    Raises only :class:`SafeMathError`, whatever the input.
    """
    if not isinstance(expression, str):
        raise SafeMathError(f"expression must be a string, got {type(expression).__name__}")
    text = expression.strip()
    if not text:
        raise SafeMathError("empty expression")
    if len(text) > MAX_LENGTH:
        raise SafeMathError(f"expression too long ({len(text)} > {MAX_LENGTH} characters)")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise SafeMathError(f"invalid expression: {type(exc).__name__}") from None
    try:
        return _walk(tree.body)
    except RecursionError:
        raise SafeMathError("expression nested too deeply") from None


def format_number(value: Number) -> str:
    """Render a number compactly: integers exactly, integral floats without ``.0``.

    Non-integral floats keep 12 significant digits (``1/3`` -> ``0.333333333333``).
    """
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, ".12g")


def calculate(expression: str) -> str:
    """The calculator tool: evaluate ``expression`` and return the formatted result."""
    return format_number(evaluate(expression))
