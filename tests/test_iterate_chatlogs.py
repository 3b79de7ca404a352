"""Chat-log import: validation errors name file, line and field; exact turn records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from builders import HAGGLE_LOG
from turnrl.policy import build_tiny_policy
from turnrl.train.iterate.chatlogs import (
    ChatLogError,
    conversation_records,
    read_chat_logs,
    tokenise_conversations,
)

torch.set_num_threads(1)

GOOD = {
    **HAGGLE_LOG,
    "messages": [*HAGGLE_LOG["messages"], {"role": "user", "content": "Thanks."}],
}


def write(tmp_path: Path, *lines: object) -> Path:
    path = tmp_path / "logs.jsonl"

    def raw(line: object) -> bytes:
        if isinstance(line, bytes):
            return line
        return (line if isinstance(line, str) else json.dumps(line)).encode()

    path.write_bytes(b"".join(raw(line) + b"\n" for line in lines))
    return path


def with_(**changes: object) -> dict:
    return {**GOOD, **changes}


def without(key: str) -> dict:
    return {k: v for k, v in GOOD.items() if k != key}


def messages_with(index: int, message: object) -> dict:
    messages = list(GOOD["messages"])
    messages[index] = message
    return with_(messages=messages)


BAD_LINES = [
    ("{not json", None, "malformed JSON"),
    ("[1, 2]", None, "JSON object"),
    (without("conversation_id"), "conversation_id", "required"),
    (with_(conversation_id=7), "conversation_id", "required"),
    (with_(task_id=""), "task_id", "non-empty"),
    (without("messages"), "messages", "missing"),
    (with_(messages=[]), "messages", "non-empty list"),
    (with_(messages="hi"), "messages", "non-empty list"),
    (messages_with(1, "hello"), "messages[1]", "must be an object"),
    (messages_with(1, {"content": "x"}), "messages[1].role", "missing"),
    (messages_with(1, {"role": "customer", "content": "x"}), "messages[1].role", "customer"),
    (messages_with(2, {"role": "assistant"}), "messages[2].content", "missing"),
    (messages_with(2, {"role": "assistant", "content": 5}), "messages[2].content", "string"),
    (
        messages_with(2, {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}),
        "messages[2].tool_calls",
        "not supported",
    ),
    (
        with_(messages=[{"role": "user", "content": "hi"}]),
        "messages",
        "no assistant message",
    ),
    (
        with_(messages=[{"role": "assistant", "content": "hi"}]),
        "messages[0].role",
        "starts with an assistant",
    ),
    (without("outcome"), "outcome", "missing"),
    (with_(outcome="1"), "outcome", "number"),
    (with_(outcome=True), "outcome", "number"),
    (
        '{"conversation_id": "c9", "messages": '
        + json.dumps(GOOD["messages"])
        + ', "outcome": NaN}',
        "outcome",
        "NaN is not a JSON number",
    ),
    (
        '{"conversation_id": "c9", "messages": '
        + json.dumps(GOOD["messages"])
        + ', "outcome": Infinity}',
        "outcome",
        "Infinity is not a JSON number",
    ),
    # what the strict reader refuses anywhere in a line (issue #15)
    ('{"conversation_id": "c\\ud800", "messages": []}', "conversation_id", "lone surrogate"),
    (
        '{"conversation_id": "c9", "messages": [{"role": "user", "content": "hi\\udc00"}]}',
        "messages[0].content",
        "lone surrogate",
    ),
    ('{"conversation_id": "c9", "conversation_id": "c8"}', "conversation_id", "appears twice"),
    ('{"conversation_id": "c9", "outcome": ' + "9" * 401 + "}", "outcome", "401 digits"),
    ('{"conversation_id": "c9", "x": ' + "[" * 100_000 + "]" * 100_000 + "}", None, "too deeply"),
    (
        b'{"conversation_id": "c9", "messages": [{"role": "user", "content": "\xff"}]}',
        "messages[0].content",
        "not UTF-8",
    ),
]


@pytest.mark.parametrize(("line", "field", "problem"), BAD_LINES)
def test_errors_name_file_line_and_field(
    tmp_path: Path, line: object, field: str | None, problem: str
) -> None:
    path = write(tmp_path, with_(conversation_id="ok"), "", line)  # bad line is line 3
    with pytest.raises(ChatLogError) as info:
        read_chat_logs(path)
    error = info.value
    assert error.source == str(path) and error.line == 3 and error.field == field
    assert str(error).startswith(f"{path}:3: ")
    if field is not None:
        assert f"field '{field}'" in str(error)
    assert problem in str(error)


def test_repeated_conversation_id_names_both_lines(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD, with_(task_id="t"), GOOD)
    with pytest.raises(ChatLogError, match=r":2: field 'conversation_id': 'c1' repeats line 1"):
        read_chat_logs(path)


def test_empty_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ChatLogError, match="no conversations"):
        read_chat_logs(write(tmp_path, ""))


def test_records_one_per_assistant_message(tmp_path: Path) -> None:
    (conversation,) = read_chat_logs(write(tmp_path, GOOD))
    assert conversation.task_id == "c1" and conversation.line == 1
    first, second = conversation_records(conversation)
    assert first.prompt == tuple(GOOD["messages"][:2]) and first.response == "<offer>90</offer>"
    assert (first.turn, first.reward, first.done) == (0, 0.0, False)
    assert second.prompt == tuple(GOOD["messages"][:4]) and second.response == "<accept/>"
    assert (second.turn, second.reward, second.done) == (1, 0.25, True)
    assert first.traj_id == second.traj_id == "c1"


def test_tokenised_records_use_the_rollout_token_layout(tmp_path: Path) -> None:
    policy = build_tiny_policy(seed=0, hidden=16, layers=1)
    conversations = read_chat_logs(write(tmp_path, with_(task_id="lamp")))
    first, second = tokenise_conversations(policy, conversations)
    messages = GOOD["messages"]
    assert first.task_id == "lamp"
    assert list(first.prompt_ids) == policy.encode_initial(messages[:2])
    response = policy.tokenizer(messages[2]["content"], add_special_tokens=False)["input_ids"]
    assert list(first.response_ids) == [*response, policy.eos_token_id]
    assert list(second.prompt_ids) == [
        *first.prompt_ids,
        *first.response_ids,
        *policy.encode_observation(messages[3]),
    ]
    assert policy.decode(second.response_ids) == "<accept/>"


def test_turns_too_long_for_the_model_are_refused_before_any_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from turnrl.cli import main

    policy = build_tiny_policy(seed=0, hidden=16, layers=1)  # 4096 positions, one per char
    long = with_(conversation_id="long")
    long["messages"] = [*GOOD["messages"][:2], {"role": "assistant", "content": "x" * 4200}]
    path = tmp_path / "logs.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(long) + "\n")
    with pytest.raises(ChatLogError, match=rf"{path}:2: field 'messages': assistant turn 0: "):
        tokenise_conversations(policy, read_chat_logs(path), source=str(path))
    # room for the logged response is not enough: new candidates need max_new_tokens
    fits = tmp_path / "fits.jsonl"
    fits.write_text(json.dumps(GOOD) + "\n")
    records = tokenise_conversations(policy, read_chat_logs(fits))
    room = 4096 - max(len(r.prompt_ids) for r in records)
    tokenise_conversations(policy, read_chat_logs(fits), max_new_tokens=room)
    with pytest.raises(ChatLogError, match="exceed the model's 4096 positions"):
        tokenise_conversations(policy, read_chat_logs(fits), max_new_tokens=room + 1)
    run = tmp_path / "run"
    argv = ["iterate", "--from-logs", str(path), "--run-dir", str(run), "env.name="]
    assert main([*argv, "policy.hidden=16", "policy.layers=1"]) == 2
    assert "exceed the model's 4096 positions" in capsys.readouterr().err
    assert not run.exists()
