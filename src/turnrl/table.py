"""TurnTable: a columnar numpy view of turn records.

Every string id (task, trajectory, role, state, node) is factorised once into
dense ``int64`` codes when the table is built, so estimators never hash strings:
grouping becomes ``np.bincount`` over integer codes. Rows stay in input order;
every per-row array (and every estimator output) is aligned with it.

Cross-record rules are enforced here: a ``(traj_id, turn)`` pair appears once,
each trajectory's turns are exactly ``0..n-1``, and a trajectory belongs to a
single task. Violations name the source, the line and the field.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

import numpy as np

from turnrl.errors import TurnRecordError
from turnrl.record_columns import RecordColumns, read_columns
from turnrl.records import validate_records
from turnrl.types import TurnRecord


def default_node_id(task_id: str, prompt_ids: Sequence[int] | None, prompt: Any) -> str | None:
    """Hash of the task and the exact context the policy saw.

    Uses ``prompt_ids`` when present (exact tokens), else the canonical JSON of
    ``prompt``. Returns ``None`` when the record carries no context at all: then the
    row is its own decision point (we never guess that two contexts are equal).
    """
    if prompt_ids is not None:
        context = "ids:" + ",".join(map(str, prompt_ids))
    elif isinstance(prompt, str):  # what json.dumps writes for a string, without its overhead
        context = "json:" + encode_basestring(prompt)
    elif prompt is not None:
        context = "json:" + json.dumps(prompt, sort_keys=True, ensure_ascii=False)
    else:
        return None
    digest = hashlib.blake2b(f"{task_id}\x00{context}".encode(), digest_size=12)
    return "n-" + digest.hexdigest()


class _Factoriser:
    """Dense codes in order of first appearance (``None`` -> -1)."""

    def __init__(self) -> None:
        self.index: dict[Hashable, int] = {}

    def code(self, key: Hashable | None) -> int:
        if key is None:
            return -1
        return self.index.setdefault(key, len(self.index))

    def names(self) -> np.ndarray:
        names = np.empty(len(self.index), dtype=object)
        for key, code in self.index.items():
            names[code] = key
        return names


def factorise(values: Sequence[Hashable] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(codes, uniques)`` with ``uniques[codes] == values``.

    Integer arrays use ``np.unique`` (sorted codes); anything else a dict
    (codes in order of first appearance). ``None`` entries get code -1.
    """
    array = np.asarray(values)
    if array.dtype.kind in "iu":
        uniques, codes = np.unique(array, return_inverse=True)
        return codes.astype(np.int64), uniques
    factoriser = _Factoriser()
    codes = np.fromiter((factoriser.code(v) for v in values), dtype=np.int64, count=len(values))
    return codes, factoriser.names()


@dataclass(frozen=True, eq=False)
class TurnTable:
    """Columnar turn records. Build with ``from_records``, ``from_jsonl`` or ``from_arrays``.

    Shapes: every ``*_code`` and per-row array has length ``n_rows``; ``*_names``
    map codes back to the original ids. Missing ``state_key`` has code -1; missing
    ``info_gain``/``q`` are NaN.
    """

    task_code: np.ndarray
    task_names: np.ndarray
    traj_code: np.ndarray
    traj_names: np.ndarray
    turn: np.ndarray
    role_code: np.ndarray
    role_names: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    state_code: np.ndarray
    state_names: np.ndarray
    node_code: np.ndarray
    node_names: np.ndarray
    info_gain: np.ndarray
    q: np.ndarray
    line: np.ndarray
    """1-based source line (JSONL line or position in the input) of each row."""
    source: str = "<records>"
    records: list[TurnRecord] | None = field(default=None, repr=False)
    """The checked input records, in row order, when built from records."""
    policy_version: np.ndarray | None = field(default=None, repr=False)
    """The weights' version that sampled each row (``policy_version``), -1 where a row
    has none; ``None`` when built from arrays without it."""

    # ------------------------------------------------------------------ build
    @classmethod
    def from_records(
        cls, records: Iterable[TurnRecord | Mapping[str, Any]], *, source: str = "<records>"
    ) -> TurnTable:
        """Check and load in-memory records: ``TurnRecord`` objects, or dicts in the
        JSON turn-record format (parsed as a line of a file would be)."""
        return cls._from_validated(validate_records(records, source=source), source)

    @classmethod
    def from_jsonl(cls, path: str | Path) -> TurnTable:
        """Read a JSONL file of turn records, validating every line (columns only:
        ``records`` is ``None``; see :mod:`turnrl.record_columns`)."""
        return cls.from_columns(read_columns(path, default_node_id), source=str(path))

    @classmethod
    def from_columns(cls, columns: RecordColumns, *, source: str) -> TurnTable:
        """Build from the columns :func:`turnrl.record_columns.read_columns` read."""
        node_names = np.array(
            [n if isinstance(n, str) else f"row-{n[1]}" for n in columns.node.names()],
            dtype=object,
        )
        return cls._checked(
            task_code=columns.task.array(),
            task_names=columns.task.names(),
            traj_code=columns.traj.array(),
            traj_names=columns.traj.names(),
            turn=np.frombuffer(columns.turn, dtype=np.int64),
            role_code=columns.role.array(),
            role_names=columns.role.names(),
            reward=np.frombuffer(columns.reward, dtype=np.float64),
            done=np.frombuffer(columns.done, dtype=np.int8).astype(bool),
            state_code=columns.state.array(),
            state_names=columns.state.names(),
            node_code=columns.node.array(),
            node_names=node_names,
            info_gain=np.frombuffer(columns.info_gain, dtype=np.float64),
            q=np.frombuffer(columns.q, dtype=np.float64),
            line=np.frombuffer(columns.line, dtype=np.int64),
            source=source,
            policy_version=np.frombuffer(columns.policy_version, dtype=np.int64),
        )

    @classmethod
    def _from_validated(cls, numbered: Iterable[tuple[int, TurnRecord]], source: str):
        tasks, trajs, roles, states, nodes = (_Factoriser() for _ in range(5))
        columns: dict[str, list[Any]] = {k: [] for k in ("task", "traj", "turn", "role", "reward")}
        columns.update({k: [] for k in ("done", "state", "node", "ig", "q", "line", "version")})
        records: list[TurnRecord] = []
        for number, record in numbered:
            records.append(record)
            columns["task"].append(tasks.code(record.task_id))
            columns["traj"].append(trajs.code(record.traj_id))
            columns["turn"].append(record.turn)
            columns["role"].append(roles.code(record.role))
            columns["reward"].append(record.reward)
            columns["done"].append(record.done)
            columns["state"].append(states.code(record.state_key))
            node = record.node_id or default_node_id(
                record.task_id, record.prompt_ids, record.prompt
            )
            # No context at all: the row is its own decision point.
            columns["node"].append(nodes.code(node if node is not None else ("row", number)))
            columns["ig"].append(np.nan if record.info_gain is None else record.info_gain)
            columns["q"].append(np.nan if record.q is None else record.q)
            columns["line"].append(number)
            version = record.policy_version
            columns["version"].append(-1 if version is None else version)
        if not records:
            raise TurnRecordError(source, None, None, "no turn records")
        node_names = nodes.names()
        node_names = np.array(
            [n if isinstance(n, str) else f"row-{n[1]}" for n in node_names], dtype=object
        )
        return cls._checked(
            task_code=np.asarray(columns["task"], dtype=np.int64),
            task_names=tasks.names(),
            traj_code=np.asarray(columns["traj"], dtype=np.int64),
            traj_names=trajs.names(),
            turn=np.asarray(columns["turn"], dtype=np.int64),
            role_code=np.asarray(columns["role"], dtype=np.int64),
            role_names=roles.names(),
            reward=np.asarray(columns["reward"], dtype=np.float64),
            done=np.asarray(columns["done"], dtype=bool),
            state_code=np.asarray(columns["state"], dtype=np.int64),
            state_names=states.names(),
            node_code=np.asarray(columns["node"], dtype=np.int64),
            node_names=node_names,
            info_gain=np.asarray(columns["ig"], dtype=np.float64),
            q=np.asarray(columns["q"], dtype=np.float64),
            line=np.asarray(columns["line"], dtype=np.int64),
            source=source,
            records=records,
            policy_version=np.asarray(columns["version"], dtype=np.int64),
        )

    @classmethod
    def from_arrays(
        cls,
        *,
        task_id: Sequence[Hashable] | np.ndarray,
        traj_id: Sequence[Hashable] | np.ndarray,
        turn: Sequence[int] | np.ndarray,
        reward: Sequence[float] | np.ndarray,
        role: Sequence[Hashable] | np.ndarray | None = None,
        done: Sequence[bool] | np.ndarray | None = None,
        state_key: Sequence[Hashable | None] | np.ndarray | None = None,
        node_id: Sequence[Hashable] | np.ndarray | None = None,
        info_gain: Sequence[float] | np.ndarray | None = None,
        q: Sequence[float] | np.ndarray | None = None,
        policy_version: Sequence[int] | np.ndarray | None = None,
        source: str = "<arrays>",
    ) -> TurnTable:
        """Build directly from per-row arrays (fast path for adapters and benchmarks).

        Ids may be integers or strings. ``node_id`` defaults to one decision point
        per row (no context is known). ``info_gain``/``q`` use NaN for "missing",
        ``policy_version`` -1.
        The same cross-record checks apply; a row's "line" is its 1-based position.
        """
        n = len(turn)
        turn_arr = np.asarray(turn, dtype=np.int64)
        reward_arr = np.asarray(reward, dtype=np.float64)
        if not np.all(np.isfinite(reward_arr)):
            row = int(np.flatnonzero(~np.isfinite(reward_arr))[0])
            raise TurnRecordError(source, row + 1, "reward", "must be finite")
        if np.any(turn_arr < 0):
            row = int(np.flatnonzero(turn_arr < 0)[0])
            raise TurnRecordError(source, row + 1, "turn", "must be an integer >= 0")
        task_code, task_names = factorise(task_id)
        traj_code, traj_names = factorise(traj_id)
        role_code, role_names = factorise(role if role is not None else ["agent"] * n)
        if state_key is None:
            state_code, state_names = np.full(n, -1, dtype=np.int64), np.empty(0, dtype=object)
        else:
            state_code, state_names = factorise(state_key)
        if node_id is None:
            node_code, node_names = np.arange(n, dtype=np.int64), np.arange(n)
        else:
            node_code, node_names = factorise(node_id)

        def floats(values: Any) -> np.ndarray:
            if values is None:
                return np.full(n, np.nan)
            return np.asarray(values, dtype=np.float64)

        return cls._checked(
            task_code=task_code,
            task_names=task_names,
            traj_code=traj_code,
            traj_names=traj_names,
            turn=turn_arr,
            role_code=role_code,
            role_names=role_names,
            reward=reward_arr,
            done=np.zeros(n, dtype=bool) if done is None else np.asarray(done, dtype=bool),
            state_code=state_code,
            state_names=state_names,
            node_code=node_code,
            node_names=node_names,
            info_gain=floats(info_gain),
            q=floats(q),
            line=np.arange(1, n + 1, dtype=np.int64),
            source=source,
            policy_version=None
            if policy_version is None
            else np.asarray(policy_version, dtype=np.int64),
        )

    @classmethod
    def _checked(cls, **columns: Any) -> TurnTable:
        table = cls(**columns)
        table._check_trajectories()
        return table

    def _check_trajectories(self) -> None:
        """Unique (traj, turn), turns 0..n-1 without gaps, one task per trajectory."""
        order = self.traj_order
        traj = self.traj_code[order]
        turn = self.turn[order]
        same = traj[1:] == traj[:-1]
        dup = np.flatnonzero(same & (turn[1:] == turn[:-1]))
        if dup.size:
            first, second = order[dup[0]], order[dup[0] + 1]
            raise TurnRecordError(
                self.source,
                int(self.line[second]),
                "turn",
                f"duplicate (traj_id={self.traj_names[traj[dup[0] + 1]]!r}, "
                f"turn={int(turn[dup[0] + 1])}); first seen on line {int(self.line[first])}",
            )
        expected = np.arange(len(order)) - np.repeat(self.traj_start, self.traj_length)
        gap = np.flatnonzero(turn != expected)
        if gap.size:
            pos = gap[0]
            raise TurnRecordError(
                self.source,
                int(self.line[order[pos]]),
                "turn",
                f"gap in turn numbers of trajectory {self.traj_names[traj[pos]]!r}: "
                f"expected turn {int(expected[pos])}, found {int(turn[pos])}",
            )
        task_sorted = self.task_code[order]
        mixed = np.flatnonzero(same & (task_sorted[1:] != task_sorted[:-1]))
        if mixed.size:
            row = order[mixed[0] + 1]
            raise TurnRecordError(
                self.source,
                int(self.line[row]),
                "task_id",
                f"trajectory {self.traj_names[traj[mixed[0] + 1]]!r} appears under two tasks "
                f"({self.task_names[task_sorted[mixed[0]]]!r} and "
                f"{self.task_names[task_sorted[mixed[0] + 1]]!r})",
            )

    # ------------------------------------------------------------ derived views
    @property
    def n_rows(self) -> int:
        return int(self.turn.shape[0])

    def __len__(self) -> int:
        return self.n_rows

    @property
    def n_tasks(self) -> int:
        return len(self.task_names)

    @property
    def n_trajectories(self) -> int:
        return len(self.traj_names)

    @cached_property
    def traj_order(self) -> np.ndarray:
        """Row indices sorted by (trajectory code, turn): each trajectory contiguous."""
        return np.lexsort((self.turn, self.traj_code))

    @cached_property
    def traj_length(self) -> np.ndarray:
        """Number of turns of each trajectory, indexed by trajectory code."""
        return np.bincount(self.traj_code, minlength=self.n_trajectories)

    @cached_property
    def traj_start(self) -> np.ndarray:
        """Position in ``traj_order`` where each trajectory starts."""
        return np.concatenate(([0], np.cumsum(self.traj_length)[:-1]))

    @cached_property
    def traj_task(self) -> np.ndarray:
        """Task code of each trajectory, indexed by trajectory code."""
        task = np.empty(self.n_trajectories, dtype=np.int64)
        task[self.traj_code] = self.task_code
        return task

    @cached_property
    def row_length(self) -> np.ndarray:
        """Number of turns of the trajectory each row belongs to."""
        return self.traj_length[self.traj_code]
