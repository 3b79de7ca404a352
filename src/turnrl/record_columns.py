"""Columnar reading of a turn-record log: the columns credit needs, fast and small.

``turnrl credit`` and ``turnrl audit`` need a handful of columns (ids, turn, reward,
done, state key, node id, information gain, q) from logs of hundreds of thousands of
lines, and every line must still be validated as strictly as
:func:`turnrl.records.parse_record` does. Parsing each line with the standard
library's ``json`` and building a ``TurnRecord`` per line (the strict reader) costs
about 100 microseconds of CPU and 1.6 kB of memory per line of a rollout log; this
reader keeps only the columns' bytes, and the whole ``turnrl credit`` command takes
a fifth of the strict reader's CPU time and peaks at 1.5x the file's size
(``make bench``, "Reading a log" in ``benchmarks/RESULTS.md``).

Two paths, one answer:

* **fast**: msgspec (a well-kept C JSON parser) decodes a line straight into a typed
  struct whose field types carry the record's rules (non-empty ids, a 64-bit turn
  >= 0, finite numbers, booleans that are booleans...); msgspec itself refuses
  invalid UTF-8, lone surrogates, ``NaN`` and numbers that overflow a float.
* **strict**: any line the fast path does not accept *exactly as the strict reader
  would* goes through :func:`turnrl.io.parse_json_line` and
  :func:`turnrl.records.parse_record`, which either raise the error naming the line
  and the field or return the record (keys turnrl does not know, unusual nesting).

msgspec keeps the last of two equal keys silently, so a line is taken by the fast
path only when duplicates are ruled out: it has no escaped quote (``\\"``) and no
space before a colon, so every ``":`` in it ends a key, and their number equals the
number of keys the struct and its nested objects received. Anything else is read
strictly, so a duplicate key is always refused.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import numpy as np

from turnrl.errors import TurnRecordError
from turnrl.io import INT64_MAX, INT64_MIN, open_input, parse_json_line
from turnrl.records import parse_record

UNSET = msgspec.UNSET
Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
Id = Annotated[str, msgspec.Meta(min_length=1)]


class _Line(msgspec.Struct, forbid_unknown_fields=True):
    """One turn-record line as the fast path accepts it (``UNSET``: key absent).

    Narrower than the format on purpose: a line that does not fit (an unknown key, a
    computed column of another type) is read by the strict path instead."""

    task_id: Id
    traj_id: Id
    turn: Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
    role: Id | msgspec.UnsetType | None = UNSET
    prompt: str | list[dict[str, Any]] | msgspec.UnsetType | None = UNSET
    response: str | msgspec.UnsetType | None = UNSET
    prompt_ids: list[Int64] | msgspec.UnsetType | None = UNSET
    response_ids: list[Int64] | msgspec.UnsetType | None = UNSET
    logprobs: list[float] | msgspec.UnsetType | None = UNSET
    reward: float | msgspec.UnsetType = UNSET
    done: bool | msgspec.UnsetType = UNSET
    state_key: Id | msgspec.UnsetType | None = UNSET
    node_id: Id | msgspec.UnsetType | None = UNSET
    info_gain: float | msgspec.UnsetType | None = UNSET
    q: float | msgspec.UnsetType | None = UNSET
    tags: list[str] | msgspec.UnsetType | None = UNSET
    tool_call: bool | msgspec.UnsetType | None = UNSET
    malformed: bool | msgspec.UnsetType | None = UNSET
    stop_reason: Id | msgspec.UnsetType | None = UNSET
    finish_reason: Id | msgspec.UnsetType | None = UNSET
    context_rebuilt: bool | msgspec.UnsetType | None = UNSET
    temperature: float | msgspec.UnsetType | None = UNSET
    policy_version: Int64 | msgspec.UnsetType | None = UNSET
    train: bool | msgspec.UnsetType = UNSET
    copy_of: Id | msgspec.UnsetType | None = UNSET
    pruned: bool | msgspec.UnsetType = UNSET
    persona: Int64 | msgspec.UnsetType | None = UNSET
    source_line: Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)] | msgspec.UnsetType | None = UNSET
    # The columns turnrl itself adds (``turnrl credit``, the trainers' rollout logs).
    advantage: float | msgspec.UnsetType = UNSET
    clip_factor: float | msgspec.UnsetType = UNSET


_DECODER = msgspec.json.Decoder(_Line)
COMPUTED = ("advantage", "clip_factor")
"""Columns ``turnrl credit`` writes; a line that has one already is rewritten."""


def _plain_message(message: dict[str, Any]) -> bool:
    """A chat message the fast path can vouch for: a string role and only string or
    null values (nested values, and the integers in them, are left to the strict path)."""
    if not isinstance(message.get("role"), str):
        return False
    return all(type(v) is str or v is None for v in message.values())


def _fast(raw: bytes) -> _Line | None:
    """The line as a ``_Line`` when the fast path is sure of it, else ``None``."""
    # (Tabs and carriage returns cannot be in a JSON string unescaped: one byte each is
    # whitespace between tokens, maybe before a colon. Single-byte searches are memchr.)
    if (b"\\" in raw and b'\\"' in raw) or b"\t" in raw or b"\r" in raw or b" :" in raw:
        return None
    try:
        line = _DECODER.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    fields = msgspec.structs.astuple(line)
    keys = len(fields) - fields.count(UNSET)
    prompt = line.prompt
    if type(prompt) is list:
        for message in prompt:
            if not _plain_message(message):
                return None
            keys += len(message)
    if raw.count(b'":') != keys:
        return None  # a key twice (or a layout the count cannot vouch for)
    logprobs, ids = line.logprobs, line.response_ids
    if type(logprobs) is list and type(ids) is list and len(logprobs) != len(ids):
        return None
    return line


class _Codes:
    """Dense codes in order of first appearance (``None`` -> -1)."""

    def __init__(self) -> None:
        self.index: dict[Hashable, int] = {}
        self.codes = array("q")

    def add(self, key: Hashable | None) -> None:
        self.codes.append(-1 if key is None else self.index.setdefault(key, len(self.index)))

    def names(self) -> np.ndarray:
        names = np.empty(len(self.index), dtype=object)
        for key, code in self.index.items():
            names[code] = key
        return names

    def array(self) -> np.ndarray:
        return np.frombuffer(self.codes, dtype=np.int64)


@dataclass
class RecordColumns:
    """Per-row columns of a log, in line order (what ``TurnTable`` is built from)."""

    task: _Codes
    traj: _Codes
    role: _Codes
    state: _Codes
    node: _Codes
    turn: array
    reward: array
    done: array
    info_gain: array
    q: array
    line: array
    computed: array
    """1 where the line already has a key of :data:`COMPUTED`."""
    policy_version: array
    """The weights' version that sampled the row (``policy_version``), -1 where unset."""


def read_columns(path: str | os.PathLike[str], node_id: Any) -> RecordColumns:
    """Read and validate every line of a turn-record JSONL file into columns.

    ``node_id(task_id, prompt_ids, prompt)`` gives the decision point of a row without
    a ``node_id`` (``turnrl.table.default_node_id``). Raises ``TurnRecordError`` naming
    the file, the line and the field, exactly as :func:`turnrl.records.iter_records`.
    """
    source = str(path)
    cols = RecordColumns(
        *(_Codes() for _ in range(5)),
        turn=array("q"),
        reward=array("d"),
        done=array("b"),
        info_gain=array("d"),
        q=array("d"),
        line=array("q"),
        computed=array("b"),
        policy_version=array("q"),
    )
    nan = float("nan")
    # Bound once: this loop runs once per line of logs of a million lines.
    coders = [(c.index, c.codes.append) for c in (cols.task, cols.traj, cols.role, cols.state)]
    (tasks, add_task), (trajs, add_traj), (roles, add_role), (states, add_state) = coders
    nodes, add_node = cols.node.index, cols.node.codes.append
    add_turn, add_reward, add_done = cols.turn.append, cols.reward.append, cols.done.append
    add_ig, add_q, add_line = cols.info_gain.append, cols.q.append, cols.line.append
    add_computed, add_version = cols.computed.append, cols.policy_version.append
    with open_input(path, error=TurnRecordError) as handle:
        for number, raw in enumerate(handle, start=1):
            raw = raw.rstrip(b"\r\n")
            if not raw or raw.isspace():
                continue
            row: Any = _fast(raw)
            if row is None:  # the strict reader: the error naming the field, or the record
                obj = parse_json_line(raw, source=source, line=number, error=TurnRecordError)
                row = parse_record(obj, source=source, line=number)
                computed = any(name in row.extra for name in COMPUTED)
            else:
                computed = row.advantage is not UNSET or row.clip_factor is not UNSET
            task_id, role, state_key, node = row.task_id, row.role, row.state_key, row.node_id
            reward, info_gain, q = row.reward, row.info_gain, row.q
            add_task(tasks.setdefault(task_id, len(tasks)))
            add_traj(trajs.setdefault(row.traj_id, len(trajs)))
            add_turn(row.turn)
            role = "agent" if role is None or role is UNSET else role
            add_role(roles.setdefault(role, len(roles)))
            add_reward(0.0 if reward is UNSET else reward)
            add_done(row.done is True)
            if state_key is None or state_key is UNSET:
                add_state(-1)
            else:
                add_state(states.setdefault(state_key, len(states)))
            if node is None or node is UNSET:
                prompt_ids, prompt = row.prompt_ids, row.prompt
                node = node_id(
                    task_id,
                    None if prompt_ids is UNSET else prompt_ids,
                    None if prompt is UNSET else prompt,
                )
                # No context at all: the row is its own decision point.
                if node is None:
                    node = ("row", number)
            add_node(nodes.setdefault(node, len(nodes)))
            add_ig(nan if info_gain is None or info_gain is UNSET else info_gain)
            add_q(nan if q is None or q is UNSET else q)
            add_line(number)
            add_computed(computed)
            version = row.policy_version
            add_version(-1 if version is None or version is UNSET else version)
    if not cols.line:
        raise TurnRecordError(source, None, None, "no turn records (the file is empty)")
    return cols
