"""Reference implementation of every estimator: deliberately slow and obvious.

One plain Python function per estimator, written straight from the issue's
definitions: loop over the rows (dicts), collect scores into ``dict`` of lists
keyed by group, compute each group's mean and std by hand. No numpy (beyond
decoding a table into rows in ``rows_from_table``), no integer codes, no
cleverness. It is the oracle for the tests (the vectorised estimators in
``turnrl.credit.estimators`` must agree with it to 1e-9) and the baseline of
``benchmarks/credit.py``. Never use it for training: it is far slower (see
``benchmarks/RESULTS.md``).

A row is a dict with the keys ``task_id``, ``traj_id``, ``turn``, ``role``,
``reward``, ``state_key`` (or None), ``node_id``, ``info_gain`` (or None) and
``q`` (or None), plus ``line`` (its source line); ``rows_from_table`` builds them
from a ``TurnTable`` (so a node id defaulted by the table is used as is).
Each function returns one float per row, in row order, with the same keyword
options and defaults as the estimator of the same name.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from turnrl.errors import TurnRecordError
from turnrl.table import TurnTable

Row = dict[str, Any]
EPS = 1e-6
"""Added to the sample std before dividing (the issue's "std + 1e-6")."""


# --------------------------------------------------------------------- rows
def rows_from_table(table: TurnTable) -> list[Row]:
    """Plain dict rows (original ids, ``None`` for missing values) in table row order.

    Only this conversion uses numpy (to decode each column to a Python list at once);
    the estimators below never do.
    """
    state = table.state_code
    columns = {
        "task_id": table.task_names[table.task_code].tolist(),
        "traj_id": table.traj_names[table.traj_code].tolist(),
        "turn": table.turn.tolist(),
        "role": table.role_names[table.role_code].tolist(),
        "reward": table.reward.tolist(),
        "state_key": [
            None if code < 0 else name
            for code, name in zip(
                state.tolist(), table.state_names[np.maximum(state, 0)].tolist(), strict=True
            )
        ]
        if len(table.state_names)
        else [None] * table.n_rows,
        "node_id": table.node_names[table.node_code].tolist(),
        "info_gain": [None if math.isnan(v) else v for v in table.info_gain.tolist()],
        "q": [None if math.isnan(v) else v for v in table.q.tolist()],
        "line": table.line.tolist(),
    }
    names = list(columns)
    return [dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True)]


# ------------------------------------------------------------------ helpers
def _normalise(values: list[float], use_std: bool, std_floor: float = 0.0) -> list[float]:
    """Subtract the mean; with std, divide by (max(sample std, std_floor) + EPS).

    One member -> 0; equal members -> exactly 0 (a rounded mean could leave ~1e-15)."""
    n = len(values)
    if n < 2 or min(values) == max(values):
        return [0.0] * n
    mean = math.fsum(values) / n
    deviations = [v - mean for v in values]
    if not use_std:
        return deviations
    std = math.sqrt(sum(d * d for d in deviations) / (n - 1))
    return [d / (max(std, std_floor) + EPS) for d in deviations]


def _normalise_by_key(
    keys: Sequence[Hashable | None],
    scores: Sequence[float],
    use_std: bool,
    std_floor: float = 0.0,
) -> list[float]:
    """Normalise ``scores[i]`` among the indices with the same ``keys[i]``; key None -> 0."""
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, key in enumerate(keys):
        if key is not None:
            members[key].append(i)
    out = [0.0] * len(scores)
    for indices in members.values():
        normalised = _normalise([scores[i] for i in indices], use_std, std_floor)
        for i, value in zip(indices, normalised, strict=True):
            out[i] = value
    return out


def _outcomes(rows: Sequence[Row]) -> dict[Hashable, float]:
    """Trajectory id -> sum of its rewards."""
    outcome: dict[Hashable, float] = defaultdict(float)
    for row in rows:
        outcome[row["traj_id"]] += row["reward"]
    return outcome


def _per_trajectory(rows: Sequence[Row], use_std: bool) -> list[float]:
    """Each trajectory's outcome normalised among its task's trajectories (once each)."""
    outcome = _outcomes(rows)
    task_of = {row["traj_id"]: row["task_id"] for row in rows}
    trajs = list(outcome)
    values = _normalise_by_key([task_of[t] for t in trajs], [outcome[t] for t in trajs], use_std)
    value_of = dict(zip(trajs, values, strict=True))
    return [value_of[row["traj_id"]] for row in rows]


def _suffix_sums(
    rows: Sequence[Row],
    values: Sequence[float],
    gamma: float,
    include: Sequence[bool] | None = None,
) -> tuple[list[float], list[int]]:
    """Per row t: ``sum over included rows j >= t of its trajectory of gamma^(j-t) values[j]``.

    Also returns the number of included terms. Walks each trajectory backwards.
    """
    by_traj: dict[Hashable, dict[int, int]] = defaultdict(dict)
    for i, row in enumerate(rows):
        by_traj[row["traj_id"]][row["turn"]] = i
    sums = [0.0] * len(rows)
    terms = [0] * len(rows)
    for turns in by_traj.values():
        running, count = 0.0, 0
        for turn in sorted(turns, reverse=True):
            i = turns[turn]
            counted = include is None or include[i]
            running = (values[i] if counted else 0.0) + gamma * running
            count += 1 if counted else 0
            sums[i], terms[i] = running, count
    return sums, terms


def _returns_to_go(rows: Sequence[Row], gamma: float) -> list[float]:
    return _suffix_sums(rows, [row["reward"] for row in rows], gamma)[0]


def _normalised_ig(rows: Sequence[Row], ig_norm: str = "turn") -> list[float]:
    """IG normalised within (task, turn) (``ig_norm="turn"``) or within the task
    (``"joint"``) among rows with IG (mean and std); others 0."""
    keys = [
        None
        if row["info_gain"] is None
        else ((row["task_id"], row["turn"]) if ig_norm == "turn" else row["task_id"])
        for row in rows
    ]
    scores = [0.0 if row["info_gain"] is None else row["info_gain"] for row in rows]
    return _normalise_by_key(keys, scores, True)


# --------------------------------------------------------------- estimators
def grpo_mixed(rows: Sequence[Row], *, use_std: bool = True, lone: str = "zero") -> list[float]:
    outcome = _outcomes(rows)
    scores = [outcome[row["traj_id"]] for row in rows]
    out = _normalise_by_key([row["task_id"] for row in rows], scores, use_std)
    if lone == "raw":  # verl: a task with one row has mean 0 and std 1
        rows_of_task: dict[Hashable, int] = defaultdict(int)
        for row in rows:
            rows_of_task[row["task_id"]] += 1
        for i, row in enumerate(rows):
            if rows_of_task[row["task_id"]] == 1:
                out[i] = scores[i] / (1.0 + EPS) if use_std else scores[i]
    return out


def grpo(rows: Sequence[Row], *, use_std: bool = True) -> list[float]:
    return _per_trajectory(rows, use_std)


def dr_grpo(rows: Sequence[Row]) -> list[float]:
    return _per_trajectory(rows, False)


def rloo(rows: Sequence[Row]) -> list[float]:
    outcome = _outcomes(rows)
    trajs_of_task: dict[Hashable, set[Hashable]] = defaultdict(set)
    for row in rows:
        trajs_of_task[row["task_id"]].add(row["traj_id"])
    out = []
    for row in rows:
        peers = trajs_of_task[row["task_id"]]
        if len(peers) < 2:
            out.append(0.0)
            continue
        others = [outcome[t] for t in peers if t != row["traj_id"]]
        out.append(outcome[row["traj_id"]] - sum(others) / len(others))
    return out


def turn_group(rows: Sequence[Row], *, gamma: float = 1.0, use_std: bool = True) -> list[float]:
    keys = [(row["task_id"], row["turn"]) for row in rows]
    return _normalise_by_key(keys, _returns_to_go(rows, gamma), use_std)


def role_turn(rows: Sequence[Row], *, gamma: float = 1.0, use_std: bool = True) -> list[float]:
    keys = [(row["task_id"], row["role"], row["turn"]) for row in rows]
    return _normalise_by_key(keys, _returns_to_go(rows, gamma), use_std)


def gigpo(
    rows: Sequence[Row],
    *,
    gamma: float = 0.95,
    omega: float = 1.0,
    episode_use_std: bool = False,
    step_use_std: bool = False,
) -> list[float]:
    episode = _per_trajectory(rows, episode_use_std)
    keys = [
        None if row["state_key"] is None else (row["task_id"], row["state_key"]) for row in rows
    ]
    step = _normalise_by_key(keys, _returns_to_go(rows, gamma), step_use_std)
    return [e + omega * s for e, s in zip(episode, step, strict=True)]


def node(rows: Sequence[Row], *, gamma: float = 1.0, use_std: bool = False) -> list[float]:
    keys = [row["node_id"] for row in rows]
    return _normalise_by_key(keys, _returns_to_go(rows, gamma), use_std)


def q(rows: Sequence[Row], *, use_std: bool = True, std_floor: float = 0.0) -> list[float]:
    for row in rows:
        if row["q"] is None:
            raise TurnRecordError("<reference>", row["line"], "q", "is missing")
    keys = [row["node_id"] for row in rows]
    return _normalise_by_key(keys, [row["q"] for row in rows], use_std, std_floor)


def a2tgpo(
    rows: Sequence[Row],
    *,
    alpha: float = 0.3,
    gamma: float = 1.0,
    beta: float = 0.3,
    ig_norm: str = "turn",
    rescale: bool = True,
) -> list[float]:
    norm_ig = _normalised_ig(rows, ig_norm)
    has_ig = [row["info_gain"] is not None for row in rows]
    accumulated, terms = _suffix_sums(rows, norm_ig, gamma, has_ig)
    outcome = _per_trajectory(rows, True)
    out = []
    for i in range(len(rows)):
        if has_ig[i]:
            divisor = math.sqrt(terms[i]) if rescale else 1.0
            out.append(outcome[i] + alpha * accumulated[i] / divisor)
        else:
            out.append(outcome[i])
    return out


def a2tgpo_clip_factor(
    rows: Sequence[Row], *, beta: float = 0.3, ig_norm: str = "turn"
) -> list[float]:
    """``1 + beta * (2 * sigmoid(normIG) - 1)`` for rows with IG, else 1."""
    norm_ig = _normalised_ig(rows, ig_norm)
    out = []
    for row, value in zip(rows, norm_ig, strict=True):
        if row["info_gain"] is None:
            out.append(1.0)
        else:
            out.append(1.0 + beta * (2.0 / (1.0 + math.exp(-value)) - 1.0))
    return out


def igpo(rows: Sequence[Row], *, gamma: float = 1.0, use_std: bool = True) -> list[float]:
    signal = [row["reward"] if row["info_gain"] is None else row["info_gain"] for row in rows]
    normalised = _normalise_by_key([row["task_id"] for row in rows], signal, use_std)
    return _suffix_sums(rows, normalised, gamma)[0]


REFERENCE: dict[str, Callable[..., list[float]]] = {
    "grpo_mixed": grpo_mixed,
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "turn_group": turn_group,
    "role_turn": role_turn,
    "gigpo": gigpo,
    "node": node,
    "q": q,
    "a2tgpo": a2tgpo,
    "igpo": igpo,
}
"""Estimator name -> reference function (advantages only; see ``a2tgpo_clip_factor``)."""
