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

    Vectorised over trajectories, in ``traj_order`` (each trajectory contiguous,
    turns ascending): pass k updates the row k turns before each trajectory's end,
    ``G_t = v_t + gamma * G_{t+1}``, for the trajectories longer than k. Pass k
    touches only those trajectories, so the total cost is O(rows + max turns), with
    no sort, and no ``gamma^-t`` rescaling that could overflow on long trajectories.
    """
    order = table.traj_order
    v = np.asarray(values, dtype=np.float64)[order]
    m = None if mask is None else np.asarray(mask, dtype=bool)[order]
    sums = v if m is None else np.where(m, v, 0.0)
    terms = None if m is None else m.astype(np.float64)
    length = table.traj_length
    end = table.traj_start + length - 1
    active = np.flatnonzero(length > 1)
    for k in range(1, int(length.max(initial=1))):
        active = active[length[active] > k]
        pos = end[active] - k
        sums[pos] += gamma * sums[pos + 1]
        if terms is not None:
            terms[pos] += terms[pos + 1]
    out_sums = np.empty_like(sums)
    out_sums[order] = sums
    if terms is None:  # every row counts: the turns left in the trajectory
        return out_sums, (table.row_length - table.turn).astype(np.float64)
    out_terms = np.empty_like(terms)
    out_terms[order] = terms
    return out_sums, out_terms


def return_to_go(table: TurnTable, gamma: float = 1.0) -> np.ndarray:
    """``G_t = sum_{j>=t} gamma^(j-t) r_j`` within each trajectory, per row."""
    return discounted_suffix_sum(table, table.reward, gamma)[0]
