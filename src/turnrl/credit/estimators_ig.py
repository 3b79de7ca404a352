"""Information-gain estimators: A2TGPO and the IGPO it builds on.

Information gain (IG) of turn t is the change, caused by that turn, of the
policy's (log-)probability of the ground-truth answer. It is computed by the
rollout (``turnrl.rollout``) and logged in the record's ``info_gain`` field; rows
without it (typically the answer turn) have NaN in ``TurnTable.info_gain``.

Common rules (from the issue): "normalise within group" = subtract the group mean,
then, when std is on, divide by (sample std with ddof=1 + 1e-6); a group of one
member gets 0.
"""

from __future__ import annotations

import numpy as np

from turnrl.credit.estimators_outcome import outcome_advantage
from turnrl.credit.registry import Credit, register_estimator
from turnrl.credit.returns import discounted_suffix_sum
from turnrl.credit.segments import dense_codes, normalise_in_groups
from turnrl.table import TurnTable

IG_NORMS = ("turn", "joint")
"""How A2TGPO groups IG for normalisation: by (task, turn index), or over the whole task."""


def normalised_info_gain(table: TurnTable, by: str = "turn") -> tuple[np.ndarray, np.ndarray]:
    """``(normIG, has_ig)``: IG normalised among the rows that have IG, mean and std.

    ``by="turn"``: within (task, turn index), A2TGPO's turn groups; ``by="joint"``:
    within the task, all turns together. Rows without IG get 0 (and ``has_ig`` False).
    """
    if by not in IG_NORMS:
        raise ValueError(f"ig_norm must be one of {IG_NORMS}, got {by!r}")
    has_ig = ~np.isnan(table.info_gain)
    task = np.where(has_ig, table.task_code, -1)
    codes, n_groups = dense_codes(task, table.turn) if by == "turn" else dense_codes(task)
    return normalise_in_groups(table.info_gain, codes, n_groups), has_ig


@register_estimator("a2tgpo", group_key="turn", needs=("info_gain",))
def a2tgpo(
    table: TurnTable,
    *,
    alpha: float = 0.3,
    gamma: float = 1.0,
    beta: float = 0.3,
    ig_norm: str = "turn",
    rescale: bool = True,
) -> Credit:
    """A2TGPO: ``A_t = alpha * D~_t + A^O`` with turn-group-normalised IG, plus an adaptive clip.

    A2TGPO (arXiv 2605.06200; code github.com/CuSO4-Chen/A-TGPO):

    - ``normIG_t``: IG normalised within (task, turn index) over the rows that
      have IG, mean and std.
    - ``D_t = sum over IG rows j >= t of the same trajectory of gamma^(j-t) *
      normIG_j``; ``D~_t = D_t / sqrt(number of terms summed)`` (the paper's
      ``sqrt(n - t + 1)`` when the IG turns are contiguous).
    - ``A^O``: ``grpo`` of the trajectory (outcome normalised among the task's
      trajectories, mean and std).
    - Rows with IG get ``alpha * D~_t + A^O``; rows without (the answer turn)
      get ``A^O`` only. ``alpha`` = 0.3, ``gamma`` = 1.
    - ``Credit.clip_factor``: ``c_t = 1 + beta * (2 * sigmoid(normIG_t) - 1)``
      (computed as ``1 + beta * tanh(normIG_t / 2)``, the same function without
      overflow), ``beta`` = 0.3; 1 for rows without IG. The loss uses the clip
      range ``[1 - eps_low * c_t, 1 + eps_high * c_t]``.

    The paper's ablations, each one switch: ``ig_norm="joint"`` normalises IG
    over all turns of the task together instead of per turn index (no
    turn-group normalisation); ``rescale=False`` keeps ``D_t`` undivided (no
    variance rescaling); ``beta=0`` gives ``c_t = 1`` everywhere (no adaptive
    clipping).

    Departures: the paper sets the std of a one-member IG group to 1; the issue's
    common rule gives such a row 0. Both give ``normIG = 0`` here (the member
    equals its group's mean), hence ``c_t = 1``. Std is the issue's sample std
    (ddof=1) + 1e-6.
    """
    norm_ig, has_ig = normalised_info_gain(table, ig_norm)
    accumulated, n_terms = discounted_suffix_sum(table, norm_ig, gamma, mask=has_ig)
    divisor = np.sqrt(np.maximum(n_terms, 1.0)) if rescale else 1.0
    rescaled = np.where(has_ig, accumulated / divisor, 0.0)
    advantages = outcome_advantage(table, use_std=True) + alpha * rescaled
    clip_factor = np.where(has_ig, 1.0 + beta * np.tanh(norm_ig / 2.0), 1.0)
    return Credit(advantages, clip_factor)


@register_estimator("igpo", group_key="task", needs=("info_gain",))
def igpo(table: TurnTable, *, gamma: float = 1.0, use_std: bool = True) -> Credit:
    """IGPO: IG and final rewards normalised jointly over the task's turns, then discounted sums.

    IGPO (Wang et al. 2025, "Information Gain-based Policy Optimization", arXiv
    2510.14967), kept to compare with ``a2tgpo``. Precisely:

    1. Each row's signal is its ``info_gain`` if it has one, else its ``reward``
       (for the answer turn: the final reward).
    2. Signals are normalised jointly over all rows of the task (all turns of all
       its trajectories), mean and std (``use_std``).
    3. A row's advantage is the discounted suffix sum (``gamma`` = 1) of the
       normalised signals of its trajectory from that turn on.

    Departures from the paper and its code: (a) the code normalises only
    positions with a non-zero IG plus the final turn (a zero-IG turn merges into
    the next one); here every row is its own turn and contributes (a non-final
    row without IG contributes its reward, usually 0); (b) a row with both IG and
    a reward uses the IG only; (c) std is the sample std (ddof=1) + 1e-6 instead
    of the code's population std (1e-8 inside the sqrt), and a one-row task gets
    0 (the code sets its std to 1, which also gives 0); (d) IGPO defines IG as a
    probability difference, while ``info_gain`` is whatever the rollout logged.
    """
    has_ig = ~np.isnan(table.info_gain)
    signal = np.where(has_ig, table.info_gain, table.reward)
    normalised = normalise_in_groups(signal, table.task_code, table.n_tasks, use_std=use_std)
    return Credit(discounted_suffix_sum(table, normalised, gamma)[0])
