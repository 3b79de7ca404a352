"""The columnar reader gives exactly what the strict record reader gives: the same
table for every valid log, the same error (file, line, field) for every bad line."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_turn_record import records as turn_records
from turnrl.errors import TurnRecordError
from turnrl.record_columns import COMPUTED, _fast, _Line, read_columns
from turnrl.records import NAMED_FIELDS, dumps_record, read_records
from turnrl.table import TurnTable, default_node_id

COLUMNS = [
    "task_code",
    "task_names",
    "traj_code",
    "traj_names",
    "turn",
    "role_code",
    "role_names",
    "reward",
    "done",
    "state_code",
    "state_names",
    "node_code",
    "node_names",
    "info_gain",
    "q",
    "line",
]


def strict_table(path: Path) -> TurnTable:
    """The table as built from the strict reader's typed records."""
    return TurnTable.from_records(read_records(path), source=str(path))


def assert_same_table(a: TurnTable, b: TurnTable) -> None:
    for name in COLUMNS:
        left, right = getattr(a, name), getattr(b, name)
        if left.dtype.kind == "f":
            np.testing.assert_array_equal(left, right, err_msg=name)  # NaN == NaN here
        else:
            assert left.tolist() == right.tolist(), name


def test_the_fast_struct_knows_every_named_field() -> None:
    assert set(_Line.__struct_fields__) == set(NAMED_FIELDS) | set(COMPUTED)


@st.composite
def logs(draw) -> list[str]:
    """Valid logs: trajectories of generated records (turns renumbered 0..n-1), each
    line compact or spaced, some with a computed ``advantage`` already."""
    lines = []
    for t in range(draw(st.integers(1, 4))):
        for turn in range(draw(st.integers(1, 3))):
            record = draw(turn_records())
            obj = json.loads(dumps_record(record))
            obj.update(traj_id=f"traj{t}", turn=turn, task_id=f"task{t % 2}")
            if draw(st.booleans()):
                obj["advantage"] = draw(st.floats(-5, 5))
            spaced = draw(st.booleans())
            lines.append(
                json.dumps(
                    obj,
                    ensure_ascii=draw(st.booleans()),
                    separators=(", ", ": ") if spaced else None,
                )
            )
    return lines


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(logs())
def test_fast_and_strict_readers_build_the_same_table(tmp_path: Path, lines: list[str]) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert_same_table(TurnTable.from_jsonl(path), strict_table(path))
    computed = np.frombuffer(read_columns(path, default_node_id).computed, dtype=np.int8)
    # A line is flagged when its object has a computed field as a key (text elsewhere in
    # the line, such as a response that says "advantage", does not count).
    assert computed.tolist() == [
        int(any(name in json.loads(line) for name in COMPUTED)) for line in lines
    ]


def test_the_computed_flag_reads_keys_not_text(tmp_path: Path) -> None:
    lines = [
        {"task_id": "t", "traj_id": "a", "turn": 0, "response": "advantage"},
        {"task_id": "t", "traj_id": "b", "turn": 0, "prompt": "clip_factor", "note": "advantage"},
        {"task_id": "t", "traj_id": "c", "turn": 0, "advantage": 0.5},
        {"task_id": "t", "traj_id": "d", "turn": 0, "clip_factor": 1.0},
    ]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    computed = np.frombuffer(read_columns(path, default_node_id).computed, dtype=np.int8)
    assert computed.tolist() == [0, 0, 1, 1]


def test_plain_rollout_lines_take_the_fast_path() -> None:
    line = (
        b'{"task_id":"t","traj_id":"a","turn":0,"prompt":[{"role":"user","content":"hi"}],'
        b'"response":"x","prompt_ids":[1,2],"response_ids":[3],"logprobs":[-0.5],'
        b'"reward":1,"done":true,"advantage":0.5}'
    )
    fast = _fast(line)
    assert fast is not None and fast.reward == 1.0 and fast.advantage == 0.5
    assert _fast(line.replace(b'"done":true', b'"done": true')) is not None


OK = b'{"task_id": "t", "traj_id": "a", "turn": 0, "reward": 1}'
BAD = {
    # a key twice, in every layout the fast path's key count could be fooled by
    "top-level duplicate": (b'{"task_id": "t", "traj_id": "a", "turn": 0, "turn": 0}', "turn"),
    "duplicate after a spaced colon": (
        b'{"task_id": "t", "traj_id": "a", "turn" : 0, "reward": 1, "reward": 1}',
        "reward",
    ),
    "duplicate beside an escaped quote": (
        b'{"task_id": "t", "traj_id": "a", "turn": 0, "response": "say \\"x\\":", '
        b'"done": true, "done": true}',
        "done",
    ),
    "duplicate in a message": (
        b'{"task_id": "t", "traj_id": "a", "turn": 0, '
        b'"prompt": [{"role": "user", "content": "a", "content": "b"}]}',
        "prompt[0].content",
    ),
    "duplicate in an unknown key": (
        b'{"task_id": "t", "traj_id": "a", "turn": 0, "meta": {"k": 1, "k": 2}}',
        "meta.k",
    ),
    "huge integer in an unknown key": (
        b'{"task_id": "t", "traj_id": "a", "turn": 0, "meta": [99999999999999999999]}',
        "meta[0]",
    ),
    "huge integer in a message": (
        b'{"task_id": "t", "traj_id": "a", "turn": 0, '
        b'"prompt": [{"role": "user", "n": 99999999999999999999}]}',
        "prompt[0].n",
    ),
    "message without a role": (
        b'{"task_id": "t", "traj_id": "a", "turn": 0, "prompt": [{"content": "x"}]}',
        "prompt",
    ),
    "empty id": (b'{"task_id": "", "traj_id": "a", "turn": 0}', "task_id"),
    "null reward": (b'{"task_id": "t", "traj_id": "a", "turn": 0, "reward": null}', "reward"),
    "boolean turn": (b'{"task_id": "t", "traj_id": "a", "turn": true}', "turn"),
    "negative turn": (b'{"task_id": "t", "traj_id": "a", "turn": -1}', "turn"),
    "turn beyond 64 bits": (
        b'{"task_id": "t", "traj_id": "a", "turn": 9223372036854775808}',
        "turn",
    ),
    "logprobs of another length": (
        b'{"task_id": "t", "traj_id": "a", "turn": 0, "response_ids": [1, 2], "logprobs": [0]}',
        "logprobs",
    ),
    "computed column of a named field": (
        b'{"task_id": "t", "traj_id": "a", "turn": 0, "advantage": "high", "train": null}',
        "train",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_lines_get_the_strict_reader_s_error(tmp_path: Path, case: str) -> None:
    line, field = BAD[case]
    path = tmp_path / "log.jsonl"
    path.write_bytes(OK + b"\n" + line + b"\n")
    with pytest.raises(TurnRecordError) as strict:
        read_records(path)
    with pytest.raises(TurnRecordError) as columnar:
        TurnTable.from_jsonl(path)
    assert (columnar.value.line, columnar.value.field) == (2, field)
    assert str(columnar.value) == str(strict.value)


def test_a_computed_column_of_another_type_is_kept_and_flagged(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(OK + b"\n" + OK.replace(b"}", b', "advantage": "high", "x": 1}') + b"\n")
    assert _fast(OK.replace(b"}", b', "advantage": "high"}')) is None
    read = read_columns(path, default_node_id)
    assert list(read.computed) == [0, 1]
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"task_id": "t", "traj_id": "a", "turn": 0, "zz": 1}', type=_Line)
