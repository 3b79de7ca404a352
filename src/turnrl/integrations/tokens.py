"""Padded token batches <-> turn tables (numpy only, shared by the verl and TRL adapters).

Trainers such as verl and TRL hold a batch as a padded token grid: per batch row a
response mask (1 on tokens the policy generated) and token-level rewards. A row is
either

* one turn (**turn layout**: one row per LLM call, e.g. Agent Lightning's
  "transition" batches, or verl rows tagged with a turn index), or
* a trajectory, or a piece of one (**segment layout**: verl's multi-turn agent
  loop puts a whole conversation in one row; its response mask has one run of
  1s per assistant message, separated by tool/user tokens with mask 0).

This module maps both layouts to turns (the rows of a ``TurnTable``) and maps
per-turn advantages back onto the tokens. Everything is vectorised over the
``(rows, tokens)`` grid; the only per-row Python loops are for optional
object-valued fields (ids given as strings, per-segment lists) and exact-context
node ids.

Rewards. ``per_turn`` (the turn-record convention): a reward on token ``t``
belongs to the last assistant segment that started at or before ``t`` (a reward
on the tool tokens after a segment is the reward received after that turn; a
reward before the first segment goes to the first). ``broadcast`` (Agent
Lightning's convention): every row of a trajectory carries the trajectory's
final reward; it is checked to be the same on all of them and counted once, on
the trajectory's last turn.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from turnrl.table import TurnTable, default_node_id, factorise

RewardMode = Literal["per_turn", "broadcast"]
REWARD_MODES: tuple[str, ...] = ("per_turn", "broadcast")


@dataclass(frozen=True)
class TokenTurns:
    """Where each turn of a padded batch lives on its token grid.

    Turns are numbered row by row (all turns of row 0, then row 1, ...), so the
    turns of one row are the contiguous range ``first[r] : first[r] + count[r]``.
    Only two grids are kept (the mask, and the segment index in segment layout,
    int32); per-token turn indices are derived on demand.
    """

    row: np.ndarray
    """(n_turns,) int64: batch row of each turn."""
    segment: np.ndarray
    """(n_turns,) int64: index of the turn's segment within its row (0 in turn layout)."""
    first: np.ndarray
    """(n_rows,) int64: index of each row's first turn."""
    count: np.ndarray
    """(n_rows,) int64: number of turns in each row (>= 1)."""
    start: np.ndarray
    """(n_turns,) int64: token position where the turn's segment starts (0 if it has none)."""
    mask: np.ndarray
    """(n_rows, n_tokens) bool: the response mask."""
    segment_of_token: np.ndarray | None
    """(n_rows, n_tokens) int32: index of the last segment started at or before each token
    (-1 before the first); ``None`` in turn layout (one turn per row)."""

    @property
    def n_turns(self) -> int:
        return int(self.row.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        return self.mask.shape  # type: ignore[return-value]

    def turn_at(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """The turn a reward on token ``(rows, cols)`` is credited to (see module doc)."""
        if self.segment_of_token is None:
            return self.first[rows]
        return self.first[rows] + np.maximum(self.segment_of_token[rows, cols], 0)

    @property
    def token_turn(self) -> np.ndarray:
        """(n_rows, n_tokens) int64: the turn of each masked token, -1 on unmasked tokens."""
        if self.segment_of_token is None:
            turn = np.broadcast_to(self.first[:, None], self.mask.shape)
        else:
            turn = self.first[:, None] + self.segment_of_token
        return np.where(self.mask, turn, -1)


def _as_mask(response_mask: np.ndarray) -> np.ndarray:
    mask = np.asarray(response_mask)
    if mask.ndim != 2:
        raise ValueError(f"response_mask must be 2-D (rows, tokens), got shape {mask.shape}")
    return mask.astype(bool, copy=False)


def _objects(values: Sequence[Any]) -> np.ndarray:
    """1-D object array (``np.array`` would turn a list of tuples into a 2-D array)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def split_turns(response_mask: np.ndarray, *, one_turn_per_row: bool) -> TokenTurns:
    """Find the turns of a padded batch.

    ``one_turn_per_row=True`` (turn layout): each row is one turn, whatever its
    mask looks like. ``False`` (segment layout): each maximal run of 1s in a row's
    mask is one turn; a row with no masked token still gets one (empty) turn, so
    its reward and its place in its group are not lost.
    """
    mask = _as_mask(response_mask)
    n_rows, n_tokens = mask.shape
    segment_of_token = None
    if one_turn_per_row:
        count = np.ones(n_rows, dtype=np.int64)
        start_rows = start_cols = start_segment = np.zeros(0, dtype=np.int64)
    else:
        starts = mask.copy()
        starts[:, 1:] &= ~mask[:, :-1]
        segment_of_token = np.cumsum(starts, axis=1, dtype=np.int32)
        segment_of_token -= 1
        n_segments = segment_of_token[:, -1] + 1 if n_tokens else np.zeros(n_rows, np.int64)
        count = np.maximum(n_segments, 1).astype(np.int64)
        start_rows, start_cols = np.nonzero(starts)
        start_segment = segment_of_token[start_rows, start_cols]
    first = np.concatenate(([0], np.cumsum(count)[:-1])).astype(np.int64)
    n_turns = int(count.sum())
    row = np.repeat(np.arange(n_rows, dtype=np.int64), count)
    segment = np.arange(n_turns, dtype=np.int64) - first[row]
    start = np.zeros(n_turns, dtype=np.int64)
    start[first[start_rows] + start_segment] = start_cols
    return TokenTurns(row, segment, first, count, start, mask, segment_of_token)


def row_rewards(token_rewards: np.ndarray) -> np.ndarray:
    """Sum of each row's token rewards, float64."""
    return np.asarray(token_rewards).sum(axis=1, dtype=np.float64)


def turn_rewards_per_turn(token_rewards: np.ndarray, turns: TokenTurns) -> np.ndarray:
    """``per_turn`` rewards: each token's reward credited to its turn (see module doc)."""
    rewards = np.asarray(token_rewards)
    if rewards.shape != turns.shape:
        raise ValueError(f"token rewards have shape {rewards.shape}, response mask {turns.shape}")
    rows, cols = np.nonzero(rewards)
    return np.bincount(
        turns.turn_at(rows, cols),
        weights=rewards[rows, cols].astype(np.float64),
        minlength=turns.n_turns,
    ).astype(np.float64)


def turn_rewards_broadcast(
    token_rewards: np.ndarray, turns: TokenTurns, traj_code: np.ndarray, turn_index: np.ndarray
) -> np.ndarray:
    """``broadcast`` rewards: the trajectory's reward, once, on its last turn.

    ``traj_code`` and ``turn_index`` are per turn. Every row of a trajectory must
    carry the same reward (sum of its token rewards); a mismatch names the rows.
    """
    per_row = row_rewards(token_rewards)
    row_traj = traj_code[turns.first]
    n_traj = int(row_traj.max()) + 1 if row_traj.size else 0
    value = np.full(n_traj, np.nan)
    value[row_traj] = per_row  # any row's value; checked against all rows below
    tolerance = 1e-6 * np.maximum(1.0, np.abs(value[row_traj]))
    bad = np.flatnonzero(np.abs(per_row - value[row_traj]) > tolerance)
    if bad.size:
        row = int(bad[0])
        others = np.flatnonzero(row_traj == row_traj[row])
        raise ValueError(
            "reward mode 'broadcast' expects every row of a trajectory to carry the same "
            f"reward, but rows {others.tolist()} of one trajectory carry "
            f"{per_row[others].tolist()}; use reward mode 'per_turn' for per-turn rewards"
        )
    last = np.full(n_traj, -1, dtype=np.int64)
    np.maximum.at(last, traj_code, turn_index)
    out = np.zeros(turns.n_turns, dtype=np.float64)
    is_last = turn_index == last[traj_code]
    out[is_last] = value[traj_code[is_last]]
    return out


def number_turns(turns: TokenTurns, row_traj: np.ndarray) -> np.ndarray:
    """Turn index of each turn in segment layout: segments counted across a trajectory's rows.

    Rows of one trajectory (same code in ``row_traj``) are taken in batch order; a
    trajectory split over several rows continues its turn numbering.
    """
    order = np.argsort(row_traj, kind="stable")
    counts_in_order = turns.count[order]
    before = np.cumsum(counts_in_order) - counts_in_order
    traj_sorted = row_traj[order]
    new_traj = np.ones(order.shape[0], dtype=bool)
    new_traj[1:] = traj_sorted[1:] != traj_sorted[:-1]
    traj_base = np.maximum.accumulate(np.where(new_traj, before, 0))
    offset = np.empty(order.shape[0], dtype=np.int64)
    offset[order] = before - traj_base
    return offset[turns.row] + turns.segment


def per_turn_values(
    values: Sequence[Any] | np.ndarray | None, turns: TokenTurns, name: str
) -> np.ndarray | None:
    """Expand a per-row field to one value per turn.

    A row's entry is either one value (used for every turn of the row) or a
    list/tuple/array with exactly one value per turn of the row (per segment).
    """
    if values is None:
        return None
    array = values if isinstance(values, np.ndarray) else _objects(list(values))
    if array.shape[0] != turns.first.shape[0]:
        raise ValueError(
            f"field {name!r} has {array.shape[0]} rows, the batch has {turns.first.shape[0]}"
        )
    if array.dtype != object or not any(isinstance(v, list | tuple | np.ndarray) for v in array):
        return array[turns.row]
    out = np.empty(turns.n_turns, dtype=object)
    for r, value in enumerate(array):
        lo, n = int(turns.first[r]), int(turns.count[r])
        if isinstance(value, list | tuple | np.ndarray):
            if len(value) != n:
                raise ValueError(
                    f"field {name!r}, batch row {r}: {len(value)} values for {n} turns "
                    "(give one value per assistant segment, or a single value)"
                )
            out[lo : lo + n] = list(value)
        else:
            out[lo : lo + n] = value
    return out


def context_node_ids(
    task_ids: np.ndarray,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: np.ndarray,
    turns: TokenTurns,
) -> np.ndarray:
    """Exact decision point of each turn: hash of the task and every token before the turn.

    The context of a turn is the row's prompt plus the row's response tokens
    before the turn's segment (earlier assistant and tool tokens). Uses
    ``turnrl.table.default_node_id``, so ids equal those of turn records that
    carry the same ``prompt_ids``. ``task_ids`` is per turn.
    """
    response = np.asarray(response_ids)
    out = np.empty(turns.n_turns, dtype=object)
    for t in range(turns.n_turns):
        r = int(turns.row[t])
        context = [int(x) for x in prompt_ids[r]]
        if turns.start[t]:
            context.extend(int(x) for x in response[r, : turns.start[t]])
        out[t] = default_node_id(str(task_ids[t]), context, None)
    return out


def build_table(
    turns: TokenTurns,
    token_rewards: np.ndarray,
    *,
    task_id: Sequence[Hashable] | np.ndarray,
    traj_id: Sequence[Hashable] | np.ndarray | None = None,
    turn: Sequence[int] | np.ndarray | None = None,
    reward_mode: RewardMode = "per_turn",
    role: Sequence[Any] | np.ndarray | None = None,
    state_key: Sequence[Any] | np.ndarray | None = None,
    node_id: Sequence[Any] | np.ndarray | None = None,
    info_gain: Sequence[Any] | np.ndarray | None = None,
    q: Sequence[Any] | np.ndarray | None = None,
    source: str = "<batch>",
) -> TurnTable:
    """A ``TurnTable`` with one row per turn of ``turns`` (in turn order).

    Per-row inputs (length ``n_rows``): ``task_id`` (the group of the prompt),
    ``traj_id`` (default: each batch row is its own trajectory), ``turn`` (turn
    layout only: the row's turn index; default: counted from the segments).
    ``role``, ``state_key``, ``node_id``, ``info_gain`` and ``q`` may give one
    value per row or a list per row (one per segment); ``None`` entries mean
    missing. Table row ``i`` is turn ``i``; ``line`` in errors is ``i + 1``.
    """
    if reward_mode not in REWARD_MODES:
        raise ValueError(f"unknown reward mode {reward_mode!r}; known: {', '.join(REWARD_MODES)}")
    n_rows = turns.first.shape[0]
    task_rows = task_id if isinstance(task_id, np.ndarray) else _objects(list(task_id))
    if task_rows.shape[0] != n_rows:
        raise ValueError(f"task ids have {task_rows.shape[0]} rows, the batch has {n_rows}")
    if traj_id is None:
        traj_rows: np.ndarray = np.arange(n_rows, dtype=np.int64)
    else:
        traj_rows = traj_id if isinstance(traj_id, np.ndarray) else _objects(list(traj_id))
        if traj_rows.shape[0] != n_rows:
            raise ValueError(
                f"trajectory ids have {traj_rows.shape[0]} rows, the batch has {n_rows}"
            )
    row_traj_code, traj_names = factorise(traj_rows)
    row_task_code, task_names = factorise(task_rows)
    if turn is None:
        turn_index = number_turns(turns, row_traj_code)
    else:
        turn_rows = np.asarray(turn, dtype=np.int64)
        if turn_rows.shape[0] != n_rows:
            raise ValueError(f"turn indices have {turn_rows.shape[0]} rows, the batch has {n_rows}")
        turn_index = turn_rows[turns.row] + turns.segment
    traj_code = row_traj_code[turns.row]
    if reward_mode == "per_turn":
        reward = turn_rewards_per_turn(token_rewards, turns)
    else:
        reward = turn_rewards_broadcast(token_rewards, turns, traj_code, turn_index)

    def floats(values: Any, name: str) -> np.ndarray | None:
        expanded = per_turn_values(values, turns, name)
        if expanded is None:
            return None
        if expanded.dtype.kind in "fiu":
            return expanded.astype(np.float64)
        return np.array([np.nan if v is None else float(v) for v in expanded], dtype=np.float64)

    roles = per_turn_values(role, turns, "role")
    role_names = None
    if roles is None:  # one role: dense codes, no per-turn strings to factorise
        roles, role_names = np.zeros(turns.n_turns, dtype=np.int64), np.array(["agent"], object)
    else:
        roles = _objects(["agent" if r is None else r for r in roles])
    nodes = per_turn_values(node_id, turns, "node_id")
    if nodes is not None:
        # a turn without a node id is its own decision point (never guessed equal to another)
        nodes = _objects([("turn", i) if n is None else n for i, n in enumerate(nodes)])

    # Ids are factorised once per batch row and passed on as dense integer codes (fast
    # path of ``from_arrays``, whose names are then ``0..k-1``); the real names go back in.
    table = TurnTable.from_arrays(
        task_id=row_task_code[turns.row],
        traj_id=traj_code,
        turn=turn_index,
        reward=reward,
        role=roles,
        state_key=per_turn_values(state_key, turns, "state_key"),
        node_id=nodes,
        info_gain=floats(info_gain, "info_gain"),
        q=floats(q, "q"),
        source=source,
    )
    names = {"task_names": task_names, "traj_names": traj_names}
    if role_names is not None:
        names["role_names"] = role_names
    return dataclasses.replace(table, **names)


def scatter_to_tokens(values: np.ndarray, turns: TokenTurns) -> np.ndarray:
    """Per-turn values onto the token grid (float32), 0 on unmasked tokens."""
    values = np.asarray(values, dtype=np.float32)
    if values.shape != (turns.n_turns,):
        raise ValueError(f"expected {turns.n_turns} per-turn values, got shape {values.shape}")
    if turns.segment_of_token is None:
        return np.where(turns.mask, values[turns.first][:, None], np.float32(0))
    # before a row's first segment the index is first - 1 (-1 wraps): masked out
    per_token = values[turns.first[:, None] + turns.segment_of_token]
    return np.where(turns.mask, per_token, np.float32(0))
