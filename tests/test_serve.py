"""The OpenAI-compatible gateway, driven by the official ``openai`` client.

A scripted policy (tiny tokenizer, deterministic replies) exercises the tool-call
path, which the random tiny model would hit only by chance; one end-to-end run
uses the real tiny ``HFPolicy``. Every server binds to 127.0.0.1 on a free port.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_scripted import (
    CALCULATOR_TOOL,
    SYSTEM,
    TOOLS_LINE,
    BlockingPolicy,
    FailingPolicy,
    ScriptedPolicy,
    as_json,
    assert_exact_prefixes,
    calculator_agent,
    calculator_reply,
    chat_body,
    post_reward,
    raw_http,
)
from turnrl import TurnTable
from turnrl.cli import build_parser
from turnrl.envs.safe_math import calculate
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.records import record_to_json
from turnrl.serve import (
    Gateway,
    GatewayConfig,
    GatewayError,
    GatewayServer,
    parse_chat_request,
)
from turnrl.serve.batcher import MicroBatcher, _Job
from turnrl.serve.cli import add_serve_command
from turnrl.serve.protocol import ChatMessage, FunctionCall, ToolSpec
from turnrl.serve.server import is_loopback
from turnrl.serve.toolcalls import message_text, parse_reply, to_policy_messages, tools_prompt
from turnrl.types import Policy

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny() -> HFPolicy:
    return build_tiny_policy(seed=0)


@pytest.fixture(scope="module")
def scripted(tiny: HFPolicy) -> ScriptedPolicy:
    return ScriptedPolicy(tiny, calculator_reply)


@pytest.fixture(scope="module")
def served(scripted: ScriptedPolicy) -> Iterator[tuple[Gateway, GatewayServer]]:
    config = GatewayConfig(batch_window_s=0.02)
    with Gateway(scripted, config) as gateway, GatewayServer(gateway) as server:
        yield gateway, server


def _serve(policy: Policy, **config: Any) -> tuple[Gateway, GatewayServer]:
    gateway = Gateway(policy, GatewayConfig(**config))
    return gateway, GatewayServer(gateway).start()


# ----------------------------------------------------------------------------- agent


# ----------------------------------------------------------------------------- agent runs


def test_tool_agent_records_exact_turns(served: tuple[Gateway, GatewayServer]) -> None:
    gateway, server = served
    client = openai.OpenAI(
        base_url=server.base_url("calc-run-1", "calc-12*13"), api_key=server.api_key
    )
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Compute 12*13."},
    ]
    first = client.chat.completions.create(
        model="turnrl", messages=messages, tools=[CALCULATOR_TOOL], logprobs=True
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "12*13"}
    assert len(choice.logprobs.content) == len("Let me<call>12*13</call>")
    assert first.model_extra["turnrl"] == {
        "rollout_id": "calc-run-1",
        "task_id": "calc-12*13",
        "turn": 0,
        "context_rebuilt": False,
        "policy_version": 0,
    }
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "156"})
    second = client.chat.completions.create(
        model="turnrl", messages=messages, tools=[CALCULATOR_TOOL]
    )
    assert second.choices[0].message.content == "<answer>156</answer>"
    assert second.choices[0].finish_reason == "stop"
    assert second.usage.prompt_tokens == len(
        gateway.views.rollout("calc-run-1")["records"][1]["prompt_ids"]
    )
    summary = post_reward(client, 1.0)
    assert summary == {
        "rollout_id": "calc-run-1",
        "task_id": "calc-12*13",
        "turns": 2,
        "finished": True,
        "context_rebuilds": 0,
        "policy_versions": [0],
        "reward": 1.0,
    }

    records = gateway.views.rollout("calc-run-1")["records"]
    zero, one = records
    policy = gateway.policy
    tool_ids = policy.encode_observation({"role": "tool", "content": "156"})
    assert one["prompt_ids"] == zero["prompt_ids"] + zero["response_ids"] + tool_ids
    assert zero["prompt_ids"] == policy.encode_initial(zero["prompt"])
    assert zero["prompt"] == [
        {"role": "system", "content": f"{SYSTEM}\n{TOOLS_LINE}"},
        {"role": "user", "content": "Compute 12*13."},
    ]
    assert one["prompt"][2:] == [
        {"role": "assistant", "content": "Let me<call>12*13</call>"},
        {"role": "tool", "content": "156"},
    ]
    assert [r["response"] for r in records] == ["Let me<call>12*13</call>", "<answer>156</answer>"]
    assert zero["response_ids"][-1] == policy.eos_token_id
    assert [(r["reward"], r["done"]) for r in records] == [(0.0, False), (1.0, True)]
    assert [r["tool_call"] for r in records] == [True, False]
    assert {(r["traj_id"], r["task_id"]) for r in records} == {("calc-run-1", "calc-12*13")}
    assert {(r["role"], r["policy_version"]) for r in records} == {("turnrl", 0)}
    # The token ids of every response, where Agent Lightning's tracer reads them.
    assert first.model_extra["prompt_token_ids"] == zero["prompt_ids"]
    assert choice.model_extra["token_ids"] == zero["response_ids"]
    assert all(r["logprobs"] == [-0.25] * len(r["response_ids"]) for r in records)
    table = TurnTable.from_records(records)
    assert table.reward.tolist() == [0.0, 1.0]


def test_headers_carry_ids_and_message_objects_echo(served: tuple[Gateway, GatewayServer]) -> None:
    gateway, server = served
    client = openai.OpenAI(
        base_url=server.base_url(),
        api_key=server.api_key,
        default_headers={"X-Rollout-Id": "hdr-1", "X-Task-Id": "task-hdr"},
    )
    messages: list[Any] = [{"role": "user", "content": "Compute 7*8."}]
    reply = client.chat.completions.create(model="m", messages=messages, tools=[CALCULATOR_TOOL])
    message = reply.choices[0].message
    messages += [
        message,
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "56"},
    ]
    client.chat.completions.create(model="m", messages=messages, tools=[CALCULATOR_TOOL])
    rollout = gateway.views.rollout("hdr-1")
    assert rollout["task_id"] == "task-hdr" and rollout["turns"] == 2
    assert rollout["records"][0]["prompt"][0] == {"role": "system", "content": TOOLS_LINE}
    assert_exact_prefixes(rollout["records"], gateway.policy.eos_token_id)
    status, body = raw_http(server, "POST", "/v1/rollouts/hdr-1/reward", b'{"reward": 0.5}')
    assert status == 200 and body["reward"] == 0.5
    status, body = raw_http(server, "GET", "/v1/rollouts/hdr-1")
    assert status == 200 and [r["reward"] for r in body["records"]] == [0.0, 0.5]


def test_real_tiny_policy_end_to_end(tiny: HFPolicy) -> None:
    gateway, server = _serve(tiny, default_max_tokens=12)
    try:
        client = openai.OpenAI(base_url=server.base_url("tiny-1"), api_key=server.api_key)
        messages: list[Any] = [{"role": "user", "content": "Compute 2+3."}]
        for _ in range(3):
            response = client.chat.completions.create(
                model="turnrl",
                messages=messages,
                tools=[CALCULATOR_TOOL],
                logprobs=True,
                seed=7,
                temperature=1.0,
            )
            choice = response.choices[0]
            assert choice.finish_reason in {"stop", "length", "tool_calls"}
            assert response.usage.completion_tokens <= 12
            messages.append(choice.message.model_dump(exclude_none=True))
            if choice.message.tool_calls:
                call_id = choice.message.tool_calls[0].id
                messages.append({"role": "tool", "tool_call_id": call_id, "content": "5"})
            else:
                messages.append({"role": "user", "content": "Go on."})
        post_reward(client, -1.0)
        records = [record_to_json(r) for r in gateway.views.finished_records()]  # as JSON lines
        assert [r["turn"] for r in records] == [0, 1, 2]
        assert_exact_prefixes(records, tiny.eos_token_id)
        for record in records:
            assert len(record["logprobs"]) == len(record["response_ids"]) <= 12
            assert record["temperature"] == 1.0
        assert records[-1]["reward"] == -1.0 and records[-1]["done"] is True
        TurnTable.from_records(records)
    finally:
        server.stop()
        gateway.close()


def test_concurrent_rollouts_are_kept_apart(served: tuple[Gateway, GatewayServer]) -> None:
    gateway, server = served
    problems = {f"conc-{i}": f"{i + 11}*{i + 3}" for i in range(8)}
    rewards: dict[str, float] = {}
    errors: list[BaseException] = []
    sampled_before = gateway.served.batch_stats()["requests"]

    def run(rollout_id: str) -> None:
        try:
            client = openai.OpenAI(base_url=server.base_url(rollout_id), api_key=server.api_key)
            rewards[rollout_id] = calculator_agent(client, f"Compute {problems[rollout_id]}.")
            post_reward(client, rewards[rollout_id])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(rid,)) for rid in problems]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert rewards == dict.fromkeys(problems, 1.0)
    assert gateway.served.batch_stats()["requests"] == sampled_before + 16
    for rollout_id, expression in problems.items():
        records = gateway.views.rollout(rollout_id)["records"]
        assert len(records) == 2
        assert f"Compute {expression}." in records[0]["prompt"][-1]["content"]
        assert records[0]["response"] == f"Let me<call>{expression}</call>"
        assert records[1]["response"] == f"<answer>{calculate(expression)}</answer>"
        assert_exact_prefixes(records, gateway.policy.eos_token_id)
    finished = [r for r in gateway.views.finished_records() if r.traj_id in problems]
    table = TurnTable.from_records(finished)
    assert len(set(table.traj_code.tolist())) == 8
    assert table.reward.sum() == 8.0


def test_rewritten_history_is_rebuilt_and_counted(served: tuple[Gateway, GatewayServer]) -> None:
    gateway, server = served
    client = openai.OpenAI(base_url=server.base_url("rewrite-1"), api_key=server.api_key)
    messages: list[Any] = [{"role": "user", "content": "Compute 3*3."}]
    reply = client.chat.completions.create(model="m", messages=messages, tools=[CALCULATOR_TOOL])
    call = reply.choices[0].message.tool_calls[0]
    before = gateway.registry.context_rebuilds
    # The agent edits its own earlier message: the conversation no longer extends turn 0.
    rewritten = [
        {"role": "user", "content": "Compute 3*3 please."},
        reply.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "9"},
    ]
    again = client.chat.completions.create(model="m", messages=rewritten, tools=[CALCULATOR_TOOL])
    assert again.model_extra["turnrl"]["context_rebuilt"] is True
    assert gateway.registry.context_rebuilds == before + 1
    record = gateway.views.rollout("rewrite-1")["records"][1]
    assert record["context_rebuilt"] is True
    # Rebuilt from text: the tool call is rendered back in the tags format.
    assert record["prompt"][1:] == [
        {"role": "user", "content": "Compute 3*3 please."},
        {"role": "assistant", "content": "Let me<call>3*3</call>"},
        {"role": "tool", "content": "9"},
    ]
    assert record["prompt_ids"] == gateway.policy.encode_initial(record["prompt"])
    assert gateway.views.rollout("rewrite-1")["context_rebuilds"] == 1


def test_several_new_messages_keep_sampled_tokens(served: tuple[Gateway, GatewayServer]) -> None:
    gateway, server = served
    client = openai.OpenAI(base_url=server.base_url("multi-1"), api_key=server.api_key)
    messages: list[Any] = [{"role": "user", "content": "Compute 4*4."}]
    reply = client.chat.completions.create(model="m", messages=messages, tools=[CALCULATOR_TOOL])
    messages += [
        reply.choices[0].message.model_dump(exclude_none=True),
        {
            "role": "tool",
            "tool_call_id": reply.choices[0].message.tool_calls[0].id,
            "content": "16",
        },
        {"role": "user", "content": "Now answer."},
    ]
    client.chat.completions.create(model="m", messages=messages, tools=[CALCULATOR_TOOL])
    records = gateway.views.rollout("multi-1")["records"]
    assert_exact_prefixes(records, gateway.policy.eos_token_id)
    assert records[1]["prompt_ids"] == gateway.policy.encode_initial(records[1]["prompt"])


def test_stream_sends_content_then_tool_calls_then_finish(
    served: tuple[Gateway, GatewayServer],
) -> None:
    gateway, server = served
    client = openai.OpenAI(base_url=server.base_url("stream-1"), api_key=server.api_key)
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Compute 5*5."}],
            tools=[CALCULATOR_TOOL],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert len(chunks) == 4
    content, call, finish, usage = chunks
    # Content and the tool call never share a delta (autogen drops the rest of a
    # delta that has content).
    assert content.choices[0].delta.role == "assistant"
    assert content.choices[0].delta.content == "Let me"
    assert content.choices[0].delta.tool_calls is None
    assert call.choices[0].delta.content is None
    (tool_call,) = call.choices[0].delta.tool_calls
    assert (tool_call.index, tool_call.function.name) == (0, "calculator")
    assert json.loads(tool_call.function.arguments) == {"expression": "5*5"}
    assert finish.choices[0].finish_reason == "tool_calls" and finish.usage is None
    assert (
        usage.choices == [] and usage.usage.completion_tokens == len("Let me<call>5*5</call>") + 1
    )
    record = gateway.views.rollout("stream-1")["records"][0]
    assert finish.choices[0].model_extra["token_ids"] == record["response_ids"]
    assert finish.model_extra["prompt_token_ids"] == record["prompt_ids"]


def test_stream_of_plain_text_has_no_usage_chunk_unless_asked(
    served: tuple[Gateway, GatewayServer],
) -> None:
    _, server = served
    client = openai.OpenAI(base_url=server.base_url("stream-2"), api_key=server.api_key)
    chunks = list(
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hello."}], stream=True
        )
    )
    assert [c.choices[0].delta.content for c in chunks] == ["<answer>?</answer>", None]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks)


def test_records_file_and_finished_rollouts(scripted: ScriptedPolicy, tmp_path: Any) -> None:
    path = tmp_path / "out" / "records.jsonl"
    gateway, server = _serve(scripted, records_path=str(path))
    try:
        client = openai.OpenAI(
            base_url=server.base_url("file-1", "calc-2*9"), api_key=server.api_key
        )
        assert calculator_agent(client, "Compute 2*9.") == 1.0
        assert not path.exists()  # nothing is written before the reward
        assert gateway.views.finished_records() == [] and len(gateway.views.records()) == 2
        post_reward(client, 1.0)
        table = TurnTable.from_jsonl(path)
        assert table.reward.tolist() == [0.0, 1.0] and table.task_names.tolist() == ["calc-2*9"]
        assert post_reward(client, 1.0)["reward"] == 1.0  # the same reward again: a no-op
        with pytest.raises(openai.ConflictError):
            post_reward(client, 0.0)
        with pytest.raises(openai.ConflictError):
            calculator_agent(client, "Compute 2*9.")
        assert len(TurnTable.from_jsonl(path).reward) == 2  # written once
        assert len(gateway.views.pop_finished()) == 2 and gateway.views.records() == []
        with pytest.raises(openai.ConflictError, match="closed"):
            calculator_agent(client, "Compute 2*9.")
    finally:
        server.stop()
        gateway.close()


# ----------------------------------------------------------------------------- errors


CHAT = "/rollouts/err-1/v1/chat/completions"


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "param"),
    [
        ("POST", CHAT, b'{"model": "m", "messages": [', {}, 400, None),
        ("POST", CHAT, b"", {}, 400, None),
        ("POST", CHAT, b"[1, 2]", {}, 400, None),
        ("POST", CHAT, chat_body(messages=...), {}, 400, "messages"),
        ("POST", CHAT, chat_body(messages=[]), {}, 400, "messages"),
        ("POST", CHAT, chat_body(model=...), {}, 400, "model"),
        (
            "POST",
            CHAT,
            chat_body(messages=[{"role": "wizard", "content": "x"}]),
            {},
            400,
            "messages[0].role",
        ),
        ("POST", CHAT, chat_body(messages=["hi"]), {}, 400, "messages[0]"),
        ("POST", CHAT, chat_body(messages=[{"role": "user"}]), {}, 400, "messages[0].content"),
        (
            "POST",
            CHAT,
            chat_body(messages=[{"role": "tool", "content": "1"}]),
            {},
            400,
            "messages[0].tool_call_id",
        ),
        (
            "POST",
            CHAT,
            chat_body(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
            {},
            400,
            "messages[0].content[0]",
        ),
        ("POST", CHAT, chat_body(n=17), {}, 400, "n"),
        ("POST", CHAT, chat_body(top_p=0.5), {}, 400, "top_p"),
        ("POST", CHAT, chat_body(temperature=5), {}, 400, "temperature"),
        ("POST", CHAT, chat_body(max_tokens=0), {}, 400, "max_tokens"),
        ("POST", CHAT, chat_body(max_tokens=10**6), {}, 400, "max_tokens"),
        ("POST", CHAT, chat_body(tool_choice="required"), {}, 400, "tool_choice"),
        (
            "POST",
            CHAT,
            chat_body(tools=[{"type": "function", "function": {"name": "1 bad"}}]),
            {},
            400,
            "tools[0].function.name",
        ),
        ("POST", CHAT, chat_body(), {"X-Rollout-Id": "other"}, 400, "X-Rollout-Id"),
        ("POST", "/v1/chat/completions", chat_body(), {}, 400, "X-Rollout-Id"),
        ("POST", "/v1/chat/completions", chat_body(), {"X-Rollout-Id": "a b"}, 400, "rollout_id"),
        ("POST", "/v1/rollouts/nobody/reward", b'{"reward": 1}', {}, 404, "rollout_id"),
        ("POST", "/v1/rollouts/nobody/reward", b'{"score": 1}', {}, 400, "reward"),
        ("POST", "/v1/rollouts/nobody/reward", b'{"reward": "high"}', {}, 400, "reward"),
        ("POST", "/v1/rollouts/nobody/reward", b'{"reward": NaN}', {}, 400, "reward"),
        ("GET", "/v1/rollouts/nobody", None, {}, 404, "rollout_id"),
        ("GET", "/v2/nowhere", None, {}, 404, None),
        ("GET", CHAT, None, {}, 405, None),
    ],
)
def test_bad_requests_get_openai_error_bodies(
    served: tuple[Gateway, GatewayServer],
    method: str,
    path: str,
    body: bytes | None,
    headers: dict[str, str],
    status: int,
    param: str | None,
) -> None:
    gateway, server = served
    got, payload = raw_http(
        server, method, path, body, {"Content-Type": "application/json", **headers}
    )
    assert got == status
    error = payload["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] in {"invalid_request_error", "not_found_error"}
    assert error["param"] == param
    assert "err-1" not in {
        r["rollout_id"] for r in gateway.views.rollouts()
    }  # failed calls leave nothing


def test_context_too_long_is_a_400(tiny: HFPolicy) -> None:
    gateway, server = _serve(ScriptedPolicy(tiny, calculator_reply, max_context=24))
    try:
        client = openai.OpenAI(
            base_url=server.base_url("long-1"), api_key=server.api_key, max_retries=0
        )
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x" * 40}]
            )
        assert caught.value.status_code == 400
        assert caught.value.code == "context_length_exceeded"
        assert gateway.views.rollouts() == []
    finally:
        server.stop()
        gateway.close()


def test_server_errors_hide_details(tiny: HFPolicy) -> None:
    gateway, server = _serve(FailingPolicy(tiny, calculator_reply))
    try:
        status, body = raw_http(server, "POST", CHAT, chat_body())
        assert status == 500
        assert body == {
            "error": {
                "message": "internal server error",
                "type": "server_error",
                "param": None,
                "code": None,
            }
        }
    finally:
        server.stop()
        gateway.close()


def _in_thread(results: dict[str, Any], key: str, call: Callable[[], Any]) -> threading.Thread:
    thread = threading.Thread(target=lambda: results.update({key: call()}))
    thread.start()
    return thread


@pytest.mark.parametrize("then", ["another call", "the reward"])
def test_a_busy_rollout_makes_other_calls_wait(tiny: HFPolicy, then: str) -> None:
    policy = BlockingPolicy(tiny)
    first_request = parse_chat_request(as_json(chat_body()))
    other = parse_chat_request(as_json(chat_body(messages=[{"role": "user", "content": "other"}])))
    results: dict[str, Any] = {}
    with Gateway(policy) as gateway:
        first = _in_thread(results, "first", lambda: gateway.complete(first_request, "busy-1"))
        assert policy.entered.wait(30)
        if then == "another call":
            second = _in_thread(results, "second", lambda: gateway.complete(other, "busy-1"))
        else:
            second = _in_thread(results, "second", lambda: gateway.reward("busy-1", 1))
        second.join(0.3)
        assert second.is_alive() and results == {}  # waiting, not refused with 409
        policy.release.set()
        first.join(30)
        second.join(30)
        assert results["first"]["turnrl"]["turn"] == 0
        if then == "another call":
            assert results["second"]["turnrl"]["turn"] == 1
            assert gateway.views.rollout("busy-1")["turns"] == 2
        else:
            assert (results["second"]["finished"], results["second"]["turns"]) == (True, 1)
        gateway.complete(first_request, "busy-2", "task-a")
        with pytest.raises(GatewayError, match="belongs to task 'task-a'"):
            gateway.reward("busy-2", 0, "task-b")


# ----------------------------------------------------------------------------- tool-call text


def test_tools_prompt_lines() -> None:
    tools = [
        ToolSpec("search", "looks a word up", {"properties": {"query": {}}}),
        ToolSpec("lookup", "", {"properties": {"a": {}, "b": {}}}),
    ]
    assert tools_prompt(tools, "tags") == (
        "<call>search: QUERY</call> search: looks a word up\n"
        '<call>lookup: {"a": "A", "b": "B"}</call> lookup'
    )
    assert tools_prompt(tools[:1], "hermes") == (
        '<tool_call>{"name": "search", "arguments": {"query": "QUERY"}}</tool_call> '
        "search: looks a word up"
    )


def test_tools_prompt_is_prepended_without_a_system_message() -> None:
    request = parse_chat_request(
        {
            "model": "m",
            "messages": [{"role": "developer", "content": ""}],
            "tools": [CALCULATOR_TOOL],
        }
    )
    assert to_policy_messages(request.messages, request.tools, "tags", tools_in_prompt=True) == [
        {"role": "system", "content": TOOLS_LINE}
    ]
    plain = parse_chat_request(as_json(chat_body()))
    assert to_policy_messages(plain.messages, (), "tags", tools_in_prompt=True) == [
        {"role": "user", "content": "hi"}
    ]


def test_reply_parsing_multi_parameter_and_unknown_tools() -> None:
    tools = (ToolSpec("add", "", {"properties": {"a": {}, "b": {}}}), ToolSpec("neg", ""))
    reply = parse_reply('sum<call>add: {"a": 1, "b": 2}</call>', tools, "tags", "call_1")
    assert reply.content == "sum"
    assert reply.tool_calls == (
        FunctionCall("call_1", "add", '{"a": 1, "b": 2}', {"a": 1, "b": 2}),
    )
    assert parse_reply("<call>neg: 4</call>", tools, "tags", "c").tool_calls[0].arguments == (
        '{"input": "4"}'
    )
    assert parse_reply("<call>mul: 4</call>", tools, "tags", "c").tool_calls == ()
    assert parse_reply("<call>neg: 4</call>", (), "tags", "c").content == "<call>neg: 4</call>"


_ARG_TEXT = st.text(st.characters(codec="ascii", exclude_characters="<>\x00"), max_size=20)


@settings(max_examples=60, deadline=None)
@given(
    arguments=st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), _ARG_TEXT, max_size=3)
)
def test_hermes_tool_calls_round_trip(arguments: dict[str, str]) -> None:
    tools = (ToolSpec("fn", "", {"properties": {key: {} for key in arguments}}),)
    call = FunctionCall("c", "fn", json.dumps(arguments), arguments)
    text = message_text(ChatMessage("assistant", None, (call,)), tools, "hermes")
    back = parse_reply(text, tools, "hermes", "c").tool_calls
    assert len(back) == 1 and back[0].name == "fn" and back[0].parsed == arguments


@settings(max_examples=60, deadline=None)
@given(expression=st.from_regex(r"[0-9][0-9+*/ -]{0,15}[0-9]", fullmatch=True))
def test_tags_tool_calls_round_trip(expression: str) -> None:
    tools = (ToolSpec("calculator", "", {"properties": {"expression": {}}}),)
    arguments = {"expression": expression}
    call = FunctionCall("c", "calculator", json.dumps(arguments), arguments)
    text = message_text(ChatMessage("assistant", "x", (call,)), tools, "tags")
    assert text == f"x<call>{expression}</call>"
    back = parse_reply(text, tools, "tags", "c")
    assert back.content == "x" and back.tool_calls[0].parsed == {"expression": expression}


# ----------------------------------------------------------------------------- plumbing


def test_seeded_requests_are_never_batched_together(scripted: ScriptedPolicy) -> None:
    batcher = MicroBatcher(scripted, window_s=0.0)
    try:
        jobs = [_Job([1], 8, 1.0, (None,)), _Job([2], 8, 1.0, (None,)), _Job([3], 8, 1.0, (0,))]
        jobs += [_Job([4], 8, 1.0, (0,)), _Job([5], 8, 0.5, (None,)), _Job([6], 9, 1.0, (None,))]
        jobs += [_Job([7], 8, 1.0, (None, None)), _Job([8], 8, 1.0, (1, 2))]
        groups = [[job.context[0] for job in group] for group in batcher._groups(jobs)]
        assert groups == [[1, 2, 7], [3], [4], [5], [6], [8]]
        sampled = batcher.submit(
            scripted.encode_initial([{"role": "user", "content": "hi"}]),
            max_new_tokens=4,
            temperature=1.0,
        )
        assert (sampled.sample.stop_reason, sampled.policy_version) == ("length", 0)
    finally:
        batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit([1], max_new_tokens=1, temperature=1.0)


def test_cli_registration_and_loopback_guard(scripted: ScriptedPolicy) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="turnrl")
    add_serve_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--records", "out.jsonl", "--port", "0"])
    assert (args.policy, args.host, args.port, args.records) == (
        "tiny",
        "127.0.0.1",
        0,
        "out.jsonl",
    )
    assert callable(args.handler)
    assert build_parser().parse_args(["serve"]).handler is args.handler  # hooked into `turnrl`
    assert is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    with Gateway(scripted) as gateway, pytest.raises(ValueError, match="loopback"):
        GatewayServer(gateway, host="0.0.0.0")
