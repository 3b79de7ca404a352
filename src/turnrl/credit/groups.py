"""The group keys of the design: which samples count as peers.

Each key maps a table to one dense group code per row (-1 = the row is in no
group of that key). ``rollout`` is special: its members are trajectories, not
rows, so its code per row is the task and ``members_are_trajectories`` is set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from turnrl.credit.segments import dense_codes
from turnrl.table import TurnTable


@dataclass(frozen=True)
class GroupKey:
    name: str
    peers: str
    """Plain-language description of who counts as a peer."""
    exact: str
    """Whether the group's mean is an exact baseline (same decision point)."""
    estimator: str
    """The estimator that normalises within this key (used by the audit)."""
    members_are_trajectories: bool = False


GROUP_KEYS: dict[str, GroupKey] = {
    k.name: k
    for k in (
        GroupKey("task", "the question, over rows (length-weighted)", "no", "grpo_mixed"),
        GroupKey("rollout", "the question, one value per trajectory", "turn 0 only", "grpo", True),
        GroupKey("turn", "question and turn index", "no", "turn_group"),
        GroupKey("role_turn", "question, agent role and turn index", "no", "role_turn"),
        GroupKey("state", "question and environment state key", "approx", "gigpo"),
        GroupKey("node", "the exact context (same decision point)", "yes", "node"),
    )
}


def group_codes(table: TurnTable, key: str) -> tuple[np.ndarray, int]:
    """Dense group code per row for ``key`` and the number of groups."""
    if key in ("task", "rollout"):
        return table.task_code, table.n_tasks
    if key == "turn":
        return dense_codes(table.task_code, table.turn)
    if key == "role_turn":
        return dense_codes(table.task_code, table.role_code, table.turn)
    if key == "state":
        return dense_codes(table.task_code, table.state_code)
    if key == "node":
        return table.node_code, len(table.node_names)
    raise ValueError(f"unknown group key {key!r}; known: {', '.join(GROUP_KEYS)}")
