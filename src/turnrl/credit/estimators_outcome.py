"""Outcome estimators: one score per trajectory (its outcome = sum of its rewards).

Every turn of a trajectory gets its trajectory's value, except in ``grpo_mixed``,
which reproduces the legacy per-row grouping on purpose (to compare and audit).

Common rules (from the issue): "normalise within group" = subtract the group mean,
then, when std is on, divide by (sample std with ddof=1 + 1e-6); a group of one
member gets 0. (verl's GRPO differs there: it gives a lone member mean 0 and std 1,
i.e. its raw score divided by 1 + 1e-6; ``grpo_mixed(lone="raw")`` reproduces that.)
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from turnrl.credit.registry import Credit, register_estimator
from turnrl.credit.returns import trajectory_outcome
from turnrl.credit.segments import STD_EPS, group_count, leave_one_out, normalise_in_groups
from turnrl.table import TurnTable

LONE_RULES = ("zero", "raw")
"""What a group with a single member gets: ``zero`` (turnrl's rule) or ``raw`` (verl's)."""


def outcome_advantage(table: TurnTable, *, use_std: bool) -> np.ndarray:
    """Per row: its trajectory's outcome normalised among the task's trajectories.

    Each trajectory counts once in its task's mean and std, whatever its length.
    Shared by ``grpo``, ``dr_grpo``, ``gigpo`` (A_E) and ``a2tgpo`` (A^O).
    """
    outcome_J = trajectory_outcome(table)
    per_traj_J = normalise_in_groups(outcome_J, table.traj_task, table.n_tasks, use_std=use_std)
    return per_traj_J[table.traj_code]


@register_estimator("grpo_mixed", group_key="task")
def grpo_mixed(
    table: TurnTable, *, use_std: bool = True, lone: Literal["zero", "raw"] = "zero"
) -> Credit:
    """Legacy mixed grouping: every row scored with its trajectory's outcome, grouped by task.

    This is what frameworks that give all turn samples of a question one ``uid``
    compute (Agent Lightning issue #489; GRPO of Shao et al. 2024, arXiv
    2402.03300, applied to per-turn rows): a trajectory with k turns counts k
    times in its task's mean and std, and turn-0 and turn-3 rows, sampled from
    different contexts, share one baseline. In #489's example (two 2-turn tool
    rollouts with reward 1, two 1-turn answers with reward 0) the scores are
    [1, 1, 1, 1, 0, 0]: mean 0.667, std 0.516, +0.645 per tool row and -1.29
    per direct answer, where per-rollout GRPO gives +-0.866.

    When every trajectory of a task has the same number of turns k, the mean is
    the per-rollout mean, but the sample std is not: with G trajectories it is
    ``sqrt(k (G-1) / (k G - 1))`` times the per-rollout std (sqrt(14/15) for
    k = 2, G = 8), so the advantages are larger by the inverse of that factor.

    ``lone`` says what a task with a single row gets: ``"zero"`` (turnrl's rule,
    as every other estimator) or ``"raw"``: verl's ``compute_grpo_outcome_advantage``
    sets a single-member group's mean to 0 and std to 1, so the row keeps its raw
    score, divided by ``1 + 1e-6`` when ``use_std`` (as verl divides by std + eps).
    With ``lone="raw"`` this estimator is what verl computes with ``uid`` = task.

    It exists to compare against and to audit; it is not a recommended estimator.
    """
    if lone not in LONE_RULES:
        raise ValueError(f"lone must be one of {', '.join(LONE_RULES)}; got {lone!r}")
    row_scores = trajectory_outcome(table)[table.traj_code]
    advantages = normalise_in_groups(row_scores, table.task_code, table.n_tasks, use_std=use_std)
    if lone == "raw":
        alone = group_count(table.task_code, table.n_tasks)[table.task_code] == 1
        scale = 1.0 / (1.0 + STD_EPS) if use_std else 1.0
        advantages[alone] = row_scores[alone] * scale
    return Credit(advantages)


@register_estimator("grpo", group_key="rollout")
def grpo(table: TurnTable, *, use_std: bool = True) -> Credit:
    """Trajectory GRPO: one outcome per trajectory, normalised within its task.

    GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300) at the rollout
    level: each trajectory counts once in its task's mean and std; every turn of
    the trajectory receives the trajectory's value. Departs from the paper only
    in the issue's conventions: sample std (ddof=1) + 1e-6, and a task with a
    single trajectory gets 0. (verl's implementation does not: it gives a lone
    sample mean 0 and std 1, i.e. its raw score; see ``grpo_mixed(lone="raw")``.)
    """
    return Credit(outcome_advantage(table, use_std=use_std))


@register_estimator("dr_grpo", group_key="rollout", scale="mean")
def dr_grpo(table: TurnTable) -> Credit:
    """Dr. GRPO: trajectory outcome minus the task's mean outcome (no std division).

    Liu et al. 2025, "Understanding R1-Zero-Like Training" (arXiv 2503.20783)
    remove the std division (it up-weights too easy / too hard questions). The
    paper's other change, a constant (not per-sequence) loss normaliser, belongs
    to the loss, not to credit assignment, so it is not part of this estimator.
    """
    return Credit(outcome_advantage(table, use_std=False))


@register_estimator("rloo", group_key="rollout", scale="mean")
def rloo(table: TurnTable) -> Credit:
    """RLOO: trajectory outcome minus the mean outcome of the task's *other* trajectories.

    REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, "Back to
    Basics", arXiv 2402.14740), with one sample per trajectory. A task with a
    lone trajectory has no baseline and gets 0 (the paper assumes k >= 2).
    """
    outcome_J = trajectory_outcome(table)
    per_traj_J = leave_one_out(outcome_J, table.traj_task, table.n_tasks)
    return Credit(per_traj_J[table.traj_code])
