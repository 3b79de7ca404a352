"""The last check before an update: every reward is in range, every advantage finite.

Rewards enter the agent loop from code turnrl did not write. A reward of ``1e308``
is finite, but a group's std of such rewards overflows to infinity and its
advantages become NaN (or silently 0); the update must never see them. So the
accepted reward range is ``|reward| <= MAX_ABS_REWARD`` (checked where agents'
rewards enter, :func:`turnrl.train.agent.contract.reward_of`), and
:func:`check_finite_credit` refuses, before the update, a reward outside it (every
return, a sum of such rewards, is then finite too) or an advantage that is not a
finite float32 (the precision the update trains in), naming the rollout, its task,
the turn and the value.
"""

from __future__ import annotations

import numpy as np

from turnrl.errors import TurnrlError
from turnrl.table import TurnTable

MAX_ABS_REWARD = 1e6
"""The accepted reward range, ``|reward| <= MAX_ABS_REWARD``. Advantages are reward
differences (divided by a group's std for most estimators) trained on in float32;
squares of rewards near 1e154 overflow float64 and rewards near 1e38 float32, and
values anywhere near that are a bug (a sentinel, a timestamp, an overflow), not a
score. 1e6 leaves every realistic reward scale (and sums over thousands of turns)
far from both limits."""

FLOAT32_MAX = float(np.finfo(np.float32).max)


class CreditOverflowError(TurnrlError, ValueError):
    """A return or advantage is not a finite float32: the update is refused."""


def check_finite_credit(table: TurnTable, advantages: np.ndarray) -> None:
    """Raise :class:`CreditOverflowError` naming the first row whose reward is outside
    ``|reward| <= MAX_ABS_REWARD`` (a group std of such rewards overflows, and the
    advantages become NaN or, divided by infinity, silently 0), or whose advantage is
    not a finite float32. Returns need no check of their own: a return is a (discounted)
    sum of rewards in the range, so ``|return| <= MAX_ABS_REWARD * turns``."""
    values = np.asarray(advantages)
    checks = (
        ("reward", table.reward, ~(np.abs(table.reward) <= MAX_ABS_REWARD)),
        ("advantage", values, ~_fits_float32(values)),
    )
    for name, column, bad in checks:
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise CreditOverflowError(
                f"refusing the update: the {name} of rollout "
                f"{table.traj_names[table.traj_code[row]]} (task "
                f"{table.task_names[table.task_code[row]]}, turn {int(table.turn[row])}) is "
                f"{float(column[row])!r} ({int(bad.sum())} of {len(column)} rows); rewards "
                f"must lie in |reward| <= {MAX_ABS_REWARD:g} (this rollout's rewards: "
                f"{_rewards_of(table, row)})"
            )


def _fits_float32(values: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.isfinite(values) & (np.abs(values) <= FLOAT32_MAX)


def _rewards_of(table: TurnTable, row: int) -> str:
    rewards = table.reward[table.traj_code == table.traj_code[row]]
    shown = ", ".join(f"{r:g}" for r in rewards[:8])
    return f"[{shown}{', ...' if len(rewards) > 8 else ''}]"
