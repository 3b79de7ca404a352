"""Turn-record validation and TurnTable construction: errors name file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnrl import TurnRecordError, TurnTable
from turnrl.records import record_to_json
from turnrl.table import default_node_id
from turnrl.types import TurnRecord


def rec(traj: str, turn: int, **kw) -> dict:
    return {"task_id": kw.pop("task_id", "t"), "traj_id": traj, "turn": turn, **kw}


def write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "log.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_columns_and_defaults() -> None:
    table = TurnTable.from_records(
        [rec("a", 0, prompt="p"), rec("a", 1, reward=1, role="tool_user", done=True), rec("b", 0)]
    )
    assert table.n_rows == 3 and table.n_tasks == 1 and table.n_trajectories == 2
    assert table.reward.tolist() == [0.0, 1.0, 0.0]
    assert table.role_names[table.role_code].tolist() == ["agent", "tool_user", "agent"]
    assert table.done.tolist() == [False, True, False]
    assert table.state_code.tolist() == [-1, -1, -1]
    assert np.isnan(table.info_gain).all() and np.isnan(table.q).all()
    assert table.traj_length.tolist() == [2, 1]
    assert table.row_length.tolist() == [2, 2, 1]


def test_identical_contexts_share_a_node_without_anyone_saying_so() -> None:
    prompt = [{"role": "user", "content": "2+2?"}]
    table = TurnTable.from_records(
        [
            rec("a", 0, prompt=prompt),
            rec("b", 0, prompt=prompt),
            rec("c", 0, prompt=[{"role": "user", "content": "2+3?"}]),
            rec("d", 0, prompt_ids=[1, 2, 3]),
            rec("e", 0, prompt_ids=[1, 2, 3]),
            rec("f", 0),  # no context at all: its own decision point
            rec("g", 0),
        ]
    )
    codes = table.node_code.tolist()
    assert codes[0] == codes[1] != codes[2]
    assert codes[3] == codes[4]
    assert len({codes[5], codes[6], codes[0], codes[3]}) == 4


def test_node_id_depends_on_task_and_prefers_ids() -> None:
    assert default_node_id("t", [1, 2], "x") == default_node_id("t", [1, 2], "y")
    assert default_node_id("t", None, "x") != default_node_id("u", None, "x")
    assert default_node_id("t", None, None) is None
    explicit = TurnTable.from_records(
        [rec("a", 0, node_id="N", prompt="p"), rec("b", 0, node_id="N")]
    )
    assert explicit.node_code.tolist() == [0, 0]


def test_records_are_typed_and_unknown_keys_kept_for_write_back() -> None:
    given_records = [rec("a", 0, extra={"k": 1}, zeta=[1, None])]
    table = TurnTable.from_records(given_records)
    record = table.records[0]
    assert isinstance(record, TurnRecord) and record.reward == 0.0 and record.role == "agent"
    assert record.extra == {"extra": {"k": 1}, "zeta": [1, None]}
    # written back: the turn record's fields with their defaults, then the unknown keys in order
    assert record_to_json(record) == {
        "task_id": "t",
        "traj_id": "a",
        "turn": 0,
        "role": "agent",
        "reward": 0.0,
        "done": False,
        "extra": {"k": 1},
        "zeta": [1, None],
    }


@pytest.mark.parametrize(
    ("records", "line", "field", "words"),
    [
        ([{"traj_id": "a", "turn": 0}], 1, "task_id", "required"),
        ([rec("a", 0), {"task_id": "t", "turn": 1}], 2, "traj_id", "required"),
        ([rec("a", 0), {"task_id": "t", "traj_id": "a"}], 2, "turn", "required"),
        ([rec("a", "0")], 1, "turn", "integer"),
        ([rec("a", True)], 1, "turn", "integer"),
        ([rec("a", -1)], 1, "turn", "integer"),
        ([rec("a", 0, reward="1")], 1, "reward", "number"),
        ([rec("a", 0, reward=float("nan"))], 1, "reward", "finite"),
        ([rec("a", 0, reward=float("inf"))], 1, "reward", "finite"),
        ([rec("a", 0, done="yes")], 1, "done", "true or false"),
        ([rec("a", 0, prompt=5)], 1, "prompt", "string or a list"),
        ([rec("a", 0, prompt=[{"content": "x"}])], 1, "prompt", "role"),
        ([rec("a", 0, prompt_ids=[1, "2"])], 1, "prompt_ids", "integers"),
        ([rec("a", 0, response_ids=[1, 2], logprobs=[0.0])], 1, "logprobs", "2 tokens"),
        ([rec("a", 0, info_gain=float("nan"))], 1, "info_gain", "finite"),
        ([rec("a", 0, q="high")], 1, "q", "number"),
        ([rec("a", 0, state_key=3)], 1, "state_key", "string"),
        ([rec("a", 0), rec("a", 0)], 2, "turn", "duplicate"),
        ([rec("a", 0), rec("a", 2)], 2, "turn", "gap"),
        ([rec("a", 1)], 1, "turn", "gap"),
        ([rec("a", 0, task_id="x"), rec("a", 1, task_id="y")], 2, "task_id", "two tasks"),
        (["not a dict"], 1, None, "JSON object"),
    ],
)
def test_bad_records_name_line_and_field(records, line, field, words) -> None:
    with pytest.raises(TurnRecordError) as err:
        TurnTable.from_records(records, source="log.jsonl")
    assert err.value.line == line
    assert err.value.field == field
    assert words in str(err.value)
    assert str(err.value).startswith(f"log.jsonl:{line}:")


def test_jsonl_errors_name_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, [json.dumps(rec("a", 0)), "", "{not json"])
    with pytest.raises(TurnRecordError, match=r"log.jsonl:3: malformed JSON"):
        TurnTable.from_jsonl(path)
    path = write(
        tmp_path, [json.dumps(rec("a", 0)), json.dumps(rec("a", 0, reward=None) | {"reward": "x"})]
    )
    with pytest.raises(TurnRecordError, match=r"log.jsonl:2: field 'reward'"):
        TurnTable.from_jsonl(path)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(TurnRecordError, match="empty"):
        TurnTable.from_jsonl(empty)
    with pytest.raises(TurnRecordError, match="cannot read"):
        TurnTable.from_jsonl(tmp_path / "missing.jsonl")


def test_blank_lines_keep_line_numbers(tmp_path: Path) -> None:
    path = write(tmp_path, [json.dumps(rec("a", 0)), "", json.dumps(rec("a", 0))])
    with pytest.raises(TurnRecordError, match=r"log.jsonl:3: field 'turn': duplicate .* line 1"):
        TurnTable.from_jsonl(path)


def test_from_arrays_matches_from_records() -> None:
    records = [rec("a", 0, reward=0.5), rec("b", 0), rec("a", 1, reward=1.0, state_key="s")]
    by_records = TurnTable.from_records(records)
    by_arrays = TurnTable.from_arrays(
        task_id=["t", "t", "t"],
        traj_id=["a", "b", "a"],
        turn=[0, 0, 1],
        reward=[0.5, 0.0, 1.0],
        state_key=[None, None, "s"],
    )
    for column in ("task_code", "traj_code", "turn", "reward", "state_code"):
        assert getattr(by_records, column).tolist() == getattr(by_arrays, column).tolist()
    with pytest.raises(TurnRecordError, match="2: field 'reward'"):
        TurnTable.from_arrays(task_id=[0, 0], traj_id=[0, 1], turn=[0, 0], reward=[0, np.nan])


@given(st.lists(st.integers(1, 5), min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_any_order_of_valid_rows_is_accepted(lengths, rnd) -> None:
    records = [rec(f"r{i}", t, reward=float(t)) for i, n in enumerate(lengths) for t in range(n)]
    rnd.shuffle(records)
    table = TurnTable.from_records(records)
    assert table.n_rows == sum(lengths)
    order = table.traj_order
    # each trajectory contiguous and in turn order
    assert np.all(np.diff(table.turn[order])[np.diff(table.traj_code[order]) == 0] == 1)
