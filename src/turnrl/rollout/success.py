"""What counts as a rollout's success flag: a bool, or the number 0 or 1.

An environment reports whether an episode succeeded as ``info["correct"]``, an agent
as ``info["success"]`` (:mod:`turnrl.train.agent.rollouts`); the ``success`` metrics
average them. Python's ``bool("false")`` is True, so a string, a list or any other
value would silently count as a success: :func:`success_flag` accepts only ``True``,
``False`` (NumPy's too), ``0`` and ``1`` (ints or floats, NumPy's too), and ``None``
(no verdict), and raises :class:`SuccessFlagError` for anything else.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from turnrl.errors import TurnrlError

__all__ = ["SuccessFlagError", "success_flag"]


class SuccessFlagError(TurnrlError, TypeError):
    """A success flag that is not a bool or 0/1; the message names who reported it."""


def success_flag(value: Any, where: str) -> bool | None:
    """``value`` as a success flag (``None`` stays ``None``); ``where`` names the
    reporter and field in the error (``"environment X: info['correct']"``)."""
    if value is None:
        return None
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, numbers.Real) and value in (0, 1):
        return bool(value == 1)
    raise SuccessFlagError(
        f"{where} must be a bool or 0/1 (None: no verdict), got {value!r} ({type(value).__name__})"
    )
