"""The last check before an update: every advantage and return is a finite number.

Rewards enter the agent loop from code turnrl did not write. A reward of ``1e308``
is finite, but a group's std of such rewards overflows to infinity and its
advantages become NaN (or silently 0); the update must never see them. So the
accepted reward range is ``|reward| <= MAX_ABS_REWARD`` (checked where agents'
rewards enter, :func:`turnrl.train.agent_programs.reward_of`), and
:func:`check_finite_credit` refuses, before the update, any non-finite return or
advantage (or one beyond float32, the precision the update trains in), naming the
rollout, its task, the turn and the value.
"""

from __future__ import annotations

import numpy as np

from turnrl.credit.returns import return_to_go
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


def check_finite_credit(table: TurnTable, advantages: np.ndarray, what: str = "advantage") -> None:
    """Raise :class:`CreditOverflowError` naming the first row whose undiscounted
    return-to-go or advantage is not finite (or does not fit a float32)."""
    for name, values in (("return", return_to_go(table)), (what, np.asarray(advantages))):
        bad = ~np.isfinite(values) | (np.abs(values) > FLOAT32_MAX)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise CreditOverflowError(
                f"refusing the update: the {name} of rollout "
                f"{table.traj_names[table.traj_code[row]]} (task "
                f"{table.task_names[table.task_code[row]]}, turn {int(table.turn[row])}) is "
                f"{float(values[row])!r} ({int(bad.sum())} of {len(values)} rows); rewards "
                f"must lie in |reward| <= {MAX_ABS_REWARD:g} (this rollout's rewards: "
                f"{_rewards_of(table, row)})"
            )


def _rewards_of(table: TurnTable, row: int) -> str:
    rewards = table.reward[table.traj_code == table.traj_code[row]]
    shown = ", ".join(f"{r:g}" for r in rewards[:8])
    return f"[{shown}{', ...' if len(rewards) > 8 else ''}]"
