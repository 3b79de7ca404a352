"""Per-trajectory sums: outcomes and discounted returns-to-go (numpy only)."""

from __future__ import annotations

import numpy as np

from turnrl.table import TurnTable


def trajectory_outcome(table: TurnTable) -> np.ndarray:
    """Outcome of each trajectory (sum of its rewards), indexed by trajectory code."""
    return np.bincount(table.traj_code, weights=table.reward, minlength=table.n_trajectories)


def discounted_suffix_sum(
    table: TurnTable, values: np.ndarray, gamma: float, *, mask: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """For each row t: ``sum over rows j >= t of its trajectory of gamma^(j-t) * values[j]``.

    With ``mask``, only rows where it is True count as terms (and the discount is
    still by turn distance). Returns ``(sums, n_terms)``, both per row in input order.

    Vectorised over trajectories: one pass per turn position, from the last turn
    back to 0 (``G_t = v_t + gamma * G_{t+1}``), so the cost is O(rows + max turns)
    and no ``gamma^-t`` rescaling can overflow on long trajectories.
    """
    order = table.traj_order
    turn_sorted = table.turn[order]
    v = np.asarray(values, dtype=np.float64)[order]
    m = np.ones(v.shape[0], dtype=bool) if mask is None else np.asarray(mask, bool)[order]
    v = np.where(m, v, 0.0)
    sums = v.copy()
    terms = m.astype(np.float64)
    # Positions (in sorted order) that have a successor in the same trajectory.
    n = v.shape[0]
    has_next = np.zeros(n, dtype=bool)
    if n > 1:
        has_next[:-1] = table.traj_code[order][1:] == table.traj_code[order][:-1]
    by_turn = np.argsort(turn_sorted, kind="stable")
    bounds = np.searchsorted(turn_sorted[by_turn], np.arange(int(turn_sorted.max()) + 2))
    for t in range(int(turn_sorted.max()) - 1, -1, -1):
        pos = by_turn[bounds[t] : bounds[t + 1]]
        pos = pos[has_next[pos]]
        sums[pos] += gamma * sums[pos + 1]
        terms[pos] += terms[pos + 1]
    out_sums = np.empty(n, dtype=np.float64)
    out_terms = np.empty(n, dtype=np.float64)
    out_sums[order] = sums
    out_terms[order] = terms
    return out_sums, out_terms


def return_to_go(table: TurnTable, gamma: float = 1.0) -> np.ndarray:
    """``G_t = sum_{j>=t} gamma^(j-t) r_j`` within each trajectory, per row."""
    return discounted_suffix_sum(table, table.reward, gamma)[0]
