"""The typed turn record: JSON line <-> TurnRecord, exact on hand-built cases and
lossless on generated ones (hypothesis)."""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnrl.errors import InputError, TurnRecordError
from turnrl.io import INT64_MAX, INT64_MIN, parse_json_line
from turnrl.records import (
    KNOWN_KEYS,
    check_record,
    dumps_record,
    parse_record,
    read_records,
    record_to_json,
)
from turnrl.table import TurnTable
from turnrl.types import AglData, TurnRecord


def line_to_record(line: str) -> TurnRecord:
    return parse_record(parse_json_line(line, source="t", line=1), source="t", line=1)


# ------------------------------------------------------------------ hand-built


def test_defaults_and_named_fields() -> None:
    record = parse_record(
        {
            "task_id": "q",
            "traj_id": "q#0",
            "turn": 1,
            "reward": 1,
            "prompt_ids": [1, 2],
            "train": False,
            "copy_of": "q#1",
            "persona": 2,
            "agl_reward": None,
            "agl_final_reward": 1,
            "note": {"k": [1, None]},
        }
    )
    assert record.role == "agent" and record.reward == 1.0 and isinstance(record.reward, float)
    assert record.done is False and record.pruned is False and record.train is False
    assert record.prompt_ids == (1, 2) and record.copy_of == "q#1" and record.persona == 2
    assert record.agl == AglData(reward=None, final_reward=1.0)
    assert record.extra == {"note": {"k": [1, None]}}
    assert dumps_record(record, advantage=-0.25) == (
        '{"task_id":"q","traj_id":"q#0","turn":1,"role":"agent","prompt_ids":[1,2],'
        '"reward":1.0,"done":false,"train":false,"copy_of":"q#1","persona":2,'
        '"agl_reward":null,"agl_final_reward":1.0,"note":{"k":[1,null]},"advantage":-0.25}'
    )


def test_record_is_frozen_and_lists_become_tuples() -> None:
    record = TurnRecord(task_id="t", traj_id="a", turn=0, prompt_ids=[1, 2], logprobs=[-0.5])
    assert record.prompt_ids == (1, 2) and record.logprobs == (-0.5,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.reward = 1.0  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(record)) == record  # Ray ships records between processes


def test_computed_columns_replace_a_key_of_the_same_name() -> None:
    record = parse_record({"task_id": "t", "traj_id": "a", "turn": 0, "advantage": 9.0, "z": 1})
    assert record.extra == {"advantage": 9.0, "z": 1}
    assert record_to_json(record, {"advantage": 0.5}) == {
        "task_id": "t",
        "traj_id": "a",
        "turn": 0,
        "role": "agent",
        "reward": 0.0,
        "done": False,
        "z": 1,
        "advantage": 0.5,
    }


@pytest.mark.parametrize(
    ("obj", "field", "words"),
    [
        ({"traj_id": "a", "turn": 0}, "task_id", "required"),
        ({"task_id": "t", "traj_id": "a", "turn": 2**63}, "turn", "64-bit integer >= 0"),
        ({"task_id": "t", "traj_id": "a", "turn": 0, "reward": None}, "reward", "null"),
        ({"task_id": "t", "traj_id": "a", "turn": 0, "reward": 10**400}, "reward", "finite"),
        ({"task_id": "t", "traj_id": "\ud800", "turn": 0}, "traj_id", "lone surrogate \\ud800"),
        ({"task_id": "t\udc01", "traj_id": "a", "turn": 0}, "task_id", "lone surrogate \\udc01"),
        ({"task_id": "t", "traj_id": "a", "turn": 0, "response": "x\ud83d"}, "response", "\\ud83d"),
        (
            {
                "task_id": "t",
                "traj_id": "a",
                "turn": 0,
                "prompt": [{"role": "u", "content": "\ud800"}],
            },
            "prompt[0].content",
            "lone surrogate",
        ),
        (
            {"task_id": "t", "traj_id": "a", "turn": 0, "prompt_ids": [2**63]},
            "prompt_ids",
            "64-bit",
        ),
        ({"task_id": "t", "traj_id": "a", "turn": 0, "train": "no"}, "train", "true or false"),
        ({"task_id": "t", "traj_id": "a", "turn": 0, "tags": ["a", 1]}, "tags", "strings"),
        ({"task_id": "t", "traj_id": "a", "turn": 0, "source_line": 0}, "source_line", ">= 1"),
        ({"task_id": "t", "traj_id": "a", "turn": 0, "agl_reward": "x"}, "agl_reward", "number"),
        ({"task_id": "t", "traj_id": "a", "turn": 0, "role": ""}, "role", "non-empty"),
    ],
)
def test_bad_values_name_the_field(obj, field, words) -> None:
    with pytest.raises(TurnRecordError) as err:
        parse_record(obj, source="in.jsonl", line=7)
    assert (err.value.source, err.value.line, err.value.field) == ("in.jsonl", 7, field)
    assert words in str(err.value) and str(err.value).startswith("in.jsonl:7: field")


def test_records_built_in_code_get_the_same_checks() -> None:
    with pytest.raises(TurnRecordError, match=r"step 3:2: field 'reward': must be finite"):
        TurnTable.from_records(
            [
                TurnRecord(task_id="t", traj_id="a", turn=0),
                TurnRecord(task_id="t", traj_id="a", turn=1, reward=float("nan")),
            ],
            source="step 3",
        )
    bad = TurnRecord(task_id="t", traj_id="a", turn=0, extra={"train": False})
    with pytest.raises(TurnRecordError, match="'train': is a named field"):
        check_record(bad)


def test_errors_keep_their_place_when_pickled() -> None:
    err = pickle.loads(pickle.dumps(TurnRecordError("f.jsonl", 3, "turn", "bad")))
    assert (err.source, err.line, err.field, str(err)) == (
        "f.jsonl",
        3,
        "turn",
        "f.jsonl:3: field 'turn': bad",
    )
    assert isinstance(err, InputError) and isinstance(err, ValueError)


# -------------------------------------------------------------------- generated

ids = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12)
texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
int64 = st.integers(INT64_MIN, INT64_MAX)
floats = st.floats(allow_nan=False, allow_infinity=False)
json_scalars = st.none() | st.booleans() | int64 | floats | texts
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
extra_keys = texts.filter(lambda k: k not in KNOWN_KEYS)
messages = st.fixed_dictionaries({"role": ids, "content": texts}, optional={"name": texts})


@st.composite
def records(draw) -> TurnRecord:
    response_ids = draw(st.none() | st.lists(int64, max_size=4).map(tuple))
    logprobs = None
    if response_ids is not None and draw(st.booleans()):
        logprobs = tuple(
            draw(st.lists(floats, min_size=len(response_ids), max_size=len(response_ids)))
        )
    agl = draw(
        st.none()
        | st.builds(
            AglData,
            reward=st.none() | floats,
            final_reward=st.none() | floats,
            response_id=st.none() | ids,
        )
    )
    optional = lambda s: st.none() | s  # noqa: E731
    return TurnRecord(
        task_id=draw(ids),
        traj_id=draw(ids),
        turn=draw(st.integers(0, INT64_MAX)),
        role=draw(ids),
        prompt=draw(optional(texts | st.lists(messages, max_size=3).map(tuple))),
        response=draw(optional(texts)),
        prompt_ids=draw(optional(st.lists(int64, max_size=5).map(tuple))),
        response_ids=response_ids,
        logprobs=logprobs,
        reward=draw(floats),
        done=draw(st.booleans()),
        state_key=draw(optional(ids)),
        node_id=draw(optional(ids)),
        info_gain=draw(optional(floats)),
        q=draw(optional(floats)),
        tags=draw(optional(st.lists(texts, max_size=3).map(tuple))),
        tool_call=draw(optional(st.booleans())),
        stop_reason=draw(optional(st.sampled_from(["stop", "length"]))),
        temperature=draw(optional(st.floats(0, 5))),
        policy_version=draw(optional(int64)),
        train=draw(st.booleans()),
        copy_of=draw(optional(ids)),
        pruned=draw(st.booleans()),
        persona=draw(optional(st.integers(0, 9))),
        source_line=draw(optional(st.integers(1, 10**6))),
        agl=agl,
        extra=draw(st.dictionaries(extra_keys, json_values, max_size=4)),
    )


@settings(max_examples=150, deadline=None)
@given(records())
def test_record_to_line_to_record_is_identity(record: TurnRecord) -> None:
    check_record(record)
    line = dumps_record(record)
    assert "\n" not in line
    assert line_to_record(line) == record


@settings(max_examples=100, deadline=None)
@given(records(), st.dictionaries(extra_keys, json_values, max_size=4))
def test_unknown_keys_survive_a_line_round_trip_in_order(record: TurnRecord, unknown) -> None:
    obj = {**record_to_json(dataclasses.replace(record, extra={})), **unknown}
    back = record_to_json(line_to_record(json.dumps(obj)))
    assert back == obj
    if unknown:  # after the named fields, in their own order
        assert list(back)[-len(unknown) :] == list(unknown)


def test_a_file_round_trips_through_read_records(tmp_path) -> None:
    rows = [
        TurnRecord(task_id="t", traj_id="a", turn=0, prompt=({"role": "user", "content": "é"},)),
        TurnRecord(task_id="t", traj_id="a", turn=1, reward=1.0, done=True, extra={"k": [1]}),
    ]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(dumps_record(r) + "\n" for r in rows), encoding="utf-8")
    assert read_records(path) == rows
