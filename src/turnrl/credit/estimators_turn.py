"""Per-turn estimators: a score per row (return-to-go or Q), grouped by decision point.

The group key says which rows count as peers: ``(task, turn)``, ``(task, role,
turn)``, ``(task, state_key)`` or ``node_id``. Only ``node`` groups are exact
baselines (same context); the others approximate "same decision point".

Common rules (from the issue): "normalise within group" = subtract the group mean,
then, when std is on, divide by (sample std with ddof=1 + 1e-6); a group of one
member gets 0. Return-to-go ``G_t = sum_{j>=t} gamma^(j-t) r_j`` within the
trajectory.
"""

from __future__ import annotations

import numpy as np

from turnrl.credit.estimators_outcome import outcome_advantage
from turnrl.credit.registry import Credit, register_estimator
from turnrl.credit.returns import return_to_go
from turnrl.credit.segments import dense_codes, normalise_in_groups
from turnrl.errors import TurnRecordError
from turnrl.table import TurnTable


def normalised_return(
    table: TurnTable, keys: tuple[np.ndarray, ...], *, gamma: float, use_std: bool
) -> np.ndarray:
    """``G_t`` normalised within the groups formed by the code arrays ``keys``.

    A row with a negative code in any key (e.g. no ``state_key``) gets 0.
    """
    codes, n_groups = dense_codes(*keys)
    return normalise_in_groups(return_to_go(table, gamma), codes, n_groups, use_std=use_std)


@register_estimator("turn_group", group_key="turn")
def turn_group(table: TurnTable, *, gamma: float = 1.0, use_std: bool = True) -> Credit:
    """Return-to-go normalised among the rows of the same task and turn index.

    The turn-group normalisation of A2TGPO (arXiv 2605.06200), which A2TGPO
    applies to information gain, applied here to the return-to-go ``G_t``: the
    peers of a turn-t row are the other turn-t rows of its task. Rows at the same
    turn index can still come from different contexts, so the baseline is an
    approximation (exact only at turn 0). A trajectory that ended before turn t
    is simply absent from the turn-t group. This estimator is turnrl's
    construction (the issue's definition), not a method from one paper.
    """
    keys = (table.task_code, table.turn)
    return Credit(normalised_return(table, keys, gamma=gamma, use_std=use_std))


@register_estimator("role_turn", group_key="role_turn")
def role_turn(table: TurnTable, *, gamma: float = 1.0, use_std: bool = True) -> Credit:
    """AT-GRPO: return-to-go normalised within (task, agent role, turn index).

    Agent- and turn-wise grouping of AT-GRPO ("Stronger MAS", ICLR 2026;
    PettingLLMs). Departure: AT-GRPO samples K candidates per (environment,
    agent, turn) and scores each with its immediate reward ``alpha*team + local``;
    here the score is the logged return-to-go ``G_t`` (put team and local parts
    into ``reward`` when logging), and the group is whatever rows share the key,
    whether or not they were sampled from one state.
    """
    keys = (table.task_code, table.role_code, table.turn)
    return Credit(normalised_return(table, keys, gamma=gamma, use_std=use_std))


@register_estimator("gigpo", group_key="state", scale="mean")
def gigpo(
    table: TurnTable,
    *,
    gamma: float = 0.95,
    omega: float = 1.0,
    episode_use_std: bool = False,
    step_use_std: bool = False,
) -> Credit:
    """GiGPO: ``A = A_E + omega * A_S`` (episode advantage plus anchor-state step advantage).

    GiGPO (Feng et al. 2025, verl-agent, arXiv 2505.10978). ``A_E`` is ``dr_grpo``
    (each trajectory's outcome minus its task's mean outcome; ``episode_use_std``
    also divides by the std). ``A_S`` is the discounted return-to-go
    (``gamma`` = 0.95) normalised, mean only by default (``step_use_std``), among
    the rows of the same task that share a ``state_key``. Rows without a
    ``state_key`` or alone in their state get ``A_S = 0``. ``omega`` = 1.

    Departures: anchor states come from the logged ``state_key`` (the
    environment's state id) instead of hashing identical observations; the
    episode return is the sum of undiscounted rewards; std is the sample std
    (ddof=1) + 1e-6.
    """
    episode = outcome_advantage(table, use_std=episode_use_std)
    keys = (table.task_code, table.state_code)
    step = normalised_return(table, keys, gamma=gamma, use_std=step_use_std)
    return Credit(episode + omega * step)


@register_estimator("node", group_key="node", aliases=("rtpo",), scale="mean")
def node(table: TurnTable, *, gamma: float = 1.0, use_std: bool = False) -> Credit:
    """Exact decision points (tree rollouts / RTPO): return-to-go minus its node's mean.

    RTPO (reverse-turn policy optimisation, arXiv 2608.18682) and tree rollouts
    branch several responses from one saved state; the rows that share a
    ``node_id`` were sampled from the same context, so their mean return is an
    unbiased baseline. Score ``G_t`` (``gamma`` = 1), mean only by default
    (``use_std`` adds the std division). Because siblings share their prefix,
    ``G_t`` minus the node mean equals RTPO's full-return ``R - mean(R)``
    whenever the rewards before the branch point are the same.

    Departures: the mean includes the row itself (GRPO convention); if RTPO's
    "mean of the siblings" excludes it, RTPO's advantage is this one times
    n/(n-1) (leave-one-out), same sign. A row alone at its node gets 0. RTPO's
    trunk trajectory (no gradient, in no baseline) must not be logged under the
    siblings' node ids, or it would enter their mean.
    """
    scores = return_to_go(table, gamma)
    # node codes are already dense (one per distinct node id): no need to recombine.
    n_nodes = len(table.node_names)
    return Credit(normalise_in_groups(scores, table.node_code, n_nodes, use_std=use_std))


@register_estimator("q", group_key="node", needs=("q",))
def q(table: TurnTable, *, use_std: bool = True, std_floor: float = 0.0) -> Credit:
    """Iterative GRPO: learned turn-level Q score normalised among responses of one state.

    Iterative GRPO (Jiang et al. 2025, arXiv 2511.21638) scores several candidate
    responses to one logged state with a fitted Q^pi and runs single-turn GRPO
    on them. Here the score is the record's ``q`` and the group is its
    ``node_id`` (the exact state); mean and std. Fitting Q is not part of credit
    assignment (see ``turnrl.train``). Every row needs a ``q``: a missing one is
    an error naming the first such row's source line and the field ``q``.

    ``std_floor`` (not in the paper; default 0 = the paper's plain std) divides
    by ``max(std, std_floor)``: when a state's candidates are nearly identical,
    Q's tiny (and unreliable) differences between them stay tiny advantages
    instead of being blown up to about +-1 (see ``docs/iterative-grpo.md``).
    """
    if std_floor < 0 or not np.isfinite(std_floor):
        raise ValueError(f"std_floor must be a finite number >= 0, got {std_floor}")
    missing = np.flatnonzero(np.isnan(table.q))
    if missing.size:
        row = int(missing[0])
        raise TurnRecordError(
            table.source,
            int(table.line[row]),
            "q",
            f"is missing ({missing.size} of {table.n_rows} rows have no q); "
            "the 'q' estimator needs a q score on every row",
        )
    n_nodes = len(table.node_names)
    return Credit(
        normalise_in_groups(table.q, table.node_code, n_nodes, use_std=use_std, std_floor=std_floor)
    )
