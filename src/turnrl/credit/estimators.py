"""Advantage estimators (filled in by the credit-library work)."""

from __future__ import annotations

import numpy as np

from turnrl.credit.registry import Credit, register_estimator
from turnrl.credit.returns import trajectory_outcome
from turnrl.credit.segments import normalise_in_groups
from turnrl.table import TurnTable


@register_estimator("grpo", group_key="rollout")
def grpo(table: TurnTable, *, use_std: bool = True) -> Credit:
    """Trajectory GRPO: one outcome per trajectory, normalised within its task."""
    outcome = trajectory_outcome(table)
    per_traj = normalise_in_groups(outcome, table.traj_task, table.n_tasks, use_std=use_std)
    return Credit(per_traj[table.traj_code])
