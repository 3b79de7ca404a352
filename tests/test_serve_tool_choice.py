"""``tool_choice`` ``"required"`` / a named function and ``parallel_tool_calls``, as sent.

A forced call: the gateway writes the start of the call block into the context and
the policy samples the rest (``turnrl.serve.toolcalls.forced_call_prefix``). The
scripted policy answers only the rest, so a reply that parses as a call shows the
forced text was in the context; the records show where it went (prompt side).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import openai
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_scripted import (
    CALCULATOR_TOOL,
    ScriptedPolicy,
    assert_exact_prefixes,
    chat_body,
    raw_http,
)
from turnrl import TurnTable
from turnrl.envs.tools import ToolCall, parse_response
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.serve import Gateway, GatewayConfig, GatewayServer
from turnrl.serve.protocol import ChatMessage, FunctionCall, ToolSpec
from turnrl.serve.toolcalls import forced_call_prefix, message_text
from turnrl.train.update.ppo import build_update_batch

torch.set_num_threads(1)

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "looks a word up",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}
MESSAGES: list[Any] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Compute 2+3."},
]
CHAT = "/rollouts/bad-1/v1/chat/completions"


@pytest.fixture(scope="module")
def tiny() -> HFPolicy:
    return build_tiny_policy(seed=0)


def _client(server: GatewayServer, rollout_id: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url(rollout_id), api_key=server.api_key)


def _ask(client: openai.OpenAI, messages: list[Any], **kwargs: Any) -> Any:
    return client.chat.completions.create(model="agent", messages=messages, **kwargs)


def _scripted(tiny: HFPolicy, answers: dict[str, str]) -> ScriptedPolicy:
    """Replies ``answers[prefix]`` when the context ends with ``prefix``, else an answer."""

    def reply(context: str) -> str:
        return next((v for k, v in answers.items() if context.endswith(k)), "<answer>5</answer>")

    return ScriptedPolicy(tiny, reply)


def test_required_forces_the_call_and_records_the_forced_tokens_as_prompt(
    tiny: HFPolicy,
) -> None:
    policy = _scripted(tiny, {"a:<call>": "2+3</call>"})
    with Gateway(policy) as gateway, GatewayServer(gateway) as server:
        client = _client(server, "req-1")
        choice = _ask(client, MESSAGES, tools=[CALCULATOR_TOOL], tool_choice="required").choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        (call,) = choice.message.tool_calls
        assert (call.function.name, call.function.arguments) == (
            "calculator",
            '{"expression": "2+3"}',
        )
        messages = [
            *MESSAGES,
            choice.message,
            {"role": "tool", "tool_call_id": call.id, "content": "5"},
        ]
        last = _ask(client, messages, tools=[CALCULATOR_TOOL]).choices[0]  # auto: not forced
        assert last.message.content == "<answer>5</answer>"
        client.post("/reward", body={"reward": 1.0}, cast_to=object)
        records = gateway.views.rollout("req-1")["records"]
        first = records[0]
        forced_ids = tiny.chat.encode_text("<call>")
        assert first["forced"] == "<call>"
        assert first["prompt_ids"] == tiny.encode_initial(first["prompt"]) + forced_ids
        # Only the sampled rest is the response: ids, text, log-probs.
        assert first["response"] == "2+3</call>"
        assert first["response_ids"] == [*tiny.chat.encode_text("2+3</call>"), tiny.eos_token_id]
        assert first["logprobs"] == [-0.25] * len(first["response_ids"])
        assert first["tool_call"] is True and first["finish_reason"] == "tool_calls"
        # The next turn extends the forced tokens exactly; the policy saw its whole call.
        assert_exact_prefixes(records, tiny.eos_token_id)
        assert records[1]["prompt"][2] == {"role": "assistant", "content": "<call>2+3</call>"}
        assert "forced" not in records[1]
        assert gateway.registry.context_rebuilds == 0


def test_a_named_function_is_forced_with_its_name(tiny: HFPolicy) -> None:
    policy = _scripted(tiny, {"a:<call>search: ": "cats</call>"})
    with Gateway(policy) as gateway, GatewayServer(gateway) as server:
        named = {"type": "function", "function": {"name": "search"}}
        reply = _ask(
            _client(server, "named-1"),
            MESSAGES,
            tools=[CALCULATOR_TOOL, SEARCH_TOOL],
            tool_choice=named,
        ).choices[0]
        (call,) = reply.message.tool_calls
        assert (call.function.name, call.function.arguments) == ("search", '{"query": "cats"}')
        (record,) = gateway.views.rollout("named-1")["records"]
        assert record["forced"] == "<call>search: "
        assert record["prompt_ids"][-len("<call>search: ") :] == tiny.chat.encode_text(
            "<call>search: "
        )
        assert record["response"] == "cats</call>"


def test_required_with_several_tools_forces_the_opener_and_the_policy_names_the_tool(
    tiny: HFPolicy,
) -> None:
    policy = _scripted(tiny, {"a:<call>": "search: dogs</call>"})
    with Gateway(policy) as gateway, GatewayServer(gateway) as server:
        reply = _ask(
            _client(server, "req-2"),
            MESSAGES,
            tools=[CALCULATOR_TOOL, SEARCH_TOOL],
            tool_choice="required",
        ).choices[0]
        (call,) = reply.message.tool_calls
        assert (call.function.name, call.function.arguments) == ("search", '{"query": "dogs"}')
        (record,) = gateway.views.rollout("req-2")["records"]
        assert record["forced"] == "<call>"
        assert record["response"] == "search: dogs</call>"  # the name was sampled


def test_hermes_forces_the_call_up_to_its_arguments(tiny: HFPolicy) -> None:
    forced = '<tool_call>{"name": "calculator", "arguments": '
    policy = _scripted(tiny, {forced: '{"expression": "2+3"}}</tool_call>'})
    with (
        Gateway(policy, GatewayConfig(tool_format="hermes")) as gateway,
        GatewayServer(gateway) as server,
    ):
        named = {"type": "function", "function": {"name": "calculator"}}
        reply = _ask(_client(server, "h-1"), MESSAGES, tools=[CALCULATOR_TOOL], tool_choice=named)
        (call,) = reply.choices[0].message.tool_calls
        assert json.loads(call.function.arguments) == {"expression": "2+3"}
        (record,) = gateway.views.rollout("h-1")["records"]
        assert record["forced"] == forced
        assert record["prompt_ids"][-len(forced) :] == tiny.chat.encode_text(forced)


def test_a_forced_reply_that_does_not_close_the_call_is_returned_as_text(tiny: HFPolicy) -> None:
    """No constrained decoding: the forced start is not a promise of a valid call."""
    policy = _scripted(tiny, {"a:<call>": "2+3"})
    with Gateway(policy) as gateway, GatewayServer(gateway) as server:
        reply = _ask(
            _client(server, "open-1"), MESSAGES, tools=[CALCULATOR_TOOL], tool_choice="required"
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "stop" and choice.message.tool_calls is None
        assert choice.message.content == "<call>2+3"


def test_the_update_trains_the_sampled_tokens_only_with_exact_logprobs(tiny: HFPolicy) -> None:
    """The real tiny model samples after the forced tokens; the update batch built from
    the records trains exactly the sampled ids, whose recorded log-probs the policy
    gives back from the recorded context."""
    with Gateway(tiny) as gateway, GatewayServer(gateway) as server:
        client = _client(server, "real-1")
        _ask(
            client,
            MESSAGES,
            tools=[CALCULATOR_TOOL],
            tool_choice="required",
            temperature=1.0,
            seed=7,
            max_tokens=12,
        )
        client.post("/reward", body={"reward": 1.0}, cast_to=object)
        records = gateway.views.finished_records()
    (record,) = records
    assert record.extra["forced"] == "<call>"
    forced_ids = tiny.chat.encode_text("<call>")
    table = TurnTable.from_records(records)
    batch = build_update_batch(records, table, np.ones(1), None, "token-mean")
    assert batch.responses == [list(record.response_ids)]
    assert batch.contexts[0][-len(forced_ids) :] == forced_ids
    assert batch.mask_B_T.sum().item() == len(record.response_ids)
    with torch.no_grad():
        logp, mask = tiny.response_logprobs(batch.contexts, batch.responses, temperature=1.0)
    assert torch.allclose(logp[mask > 0], batch.old_logp_B_T[mask > 0], atol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),  # no tools
        ({"tools": [CALCULATOR_TOOL], "tool_choice": "always"}, "tool_choice"),
        ({"tools": [CALCULATOR_TOOL], "tool_choice": {"type": "tool"}}, "tool_choice.type"),
        ({"tools": [CALCULATOR_TOOL], "tool_choice": {"type": "function"}}, "tool_choice.function"),
        (
            {
                "tools": [CALCULATOR_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "search"}},
            },
            "tool_choice.function.name",
        ),
        (
            {"tool_choice": {"type": "function", "function": {"name": "calculator"}}},
            "tool_choice.function.name",
        ),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
def test_bad_tool_choices_are_a_400_naming_the_field(
    tiny: HFPolicy, overrides: dict[str, Any], param: str
) -> None:
    with Gateway(_scripted(tiny, {})) as gateway, GatewayServer(gateway) as server:
        status, payload = raw_http(server, "POST", CHAT, chat_body(**overrides))
        assert status == 400
        assert payload["error"]["param"] == param
        assert gateway.views.rollouts() == []


def test_a_name_not_among_tools_is_named_in_the_message(tiny: HFPolicy) -> None:
    with Gateway(_scripted(tiny, {})) as gateway, GatewayServer(gateway) as server:
        named = {"type": "function", "function": {"name": "search"}}
        with pytest.raises(openai.BadRequestError) as caught:
            _ask(_client(server, "n-1"), MESSAGES, tools=[CALCULATOR_TOOL], tool_choice=named)
        assert caught.value.param == "tool_choice.function.name"
        assert "'search'" in caught.value.message and "calculator" in caught.value.message


@pytest.mark.parametrize("parallel", [False, True])
def test_parallel_tool_calls_is_accepted_and_one_call_is_parsed_per_reply(
    tiny: HFPolicy, parallel: bool
) -> None:
    two = "<call>1+1</call><call>2+2</call>"
    policy = _scripted(
        tiny,
        {
            "Two.<|im_end|>\n<|im_start|>a:": two,
            "One.<|im_end|>\n<|im_start|>a:": "<call>1+1</call>",
        },
    )
    with Gateway(policy) as gateway, GatewayServer(gateway) as server:
        client = _client(server, f"par-{parallel}")
        one = _ask(
            client,
            [{"role": "user", "content": "One."}],
            tools=[CALCULATOR_TOOL],
            parallel_tool_calls=parallel,
        )
        (call,) = one.choices[0].message.tool_calls
        assert call.function.arguments == '{"expression": "1+1"}'
        both = _ask(
            _client(server, f"par2-{parallel}"),
            [{"role": "user", "content": "Two."}],
            tools=[CALCULATOR_TOOL],
            parallel_tool_calls=parallel,
        ).choices[0]
        # Two call blocks are not a call (docs/gateway.md): the text comes back as written.
        assert both.message.tool_calls is None and both.message.content == two


_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,12}", fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(
    names=st.lists(_NAMES, min_size=1, max_size=3, unique=True),
    pick=st.integers(0, 2),
    argument=st.from_regex(r"[0-9a-z+*() -]{0,10}[0-9a-z]", fullmatch=True),
    fmt=st.sampled_from(["tags", "hermes"]),
    named=st.booleans(),
)
def test_every_call_block_starts_with_its_forced_prefix(
    names: list[str], pick: int, argument: str, fmt: str, named: bool
) -> None:
    tools = tuple(
        ToolSpec(n, "", {"type": "object", "properties": {"x": {"type": "string"}}}) for n in names
    )
    name = names[pick % len(names)]
    call = FunctionCall("c", name, json.dumps({"x": argument}), {"x": argument})
    block = message_text(ChatMessage("assistant", None, (call,)), tools, fmt)
    prefix = forced_call_prefix(tools, fmt, name if named else None)
    assert block.startswith(prefix)
    # The forced part holds the name whenever the function is known, and never more.
    known = named or len(tools) == 1
    assert (json.dumps(name) in prefix) == (known and fmt == "hermes")
    if fmt == "tags":
        bare = len(tools) == 1
        assert prefix == ("<call>" if bare or not named else f"<call>{name}: ")
    # The forced text plus the rest parses back as the call to that tool.
    action = parse_response(
        block, fmt, tool_names=names, default_tool=names[0] if len(names) == 1 else None
    )
    assert isinstance(action, ToolCall) and action.name == name


def test_a_forced_call_streams_and_each_choice_is_forced(tiny: HFPolicy) -> None:
    policy = _scripted(tiny, {"a:<call>": "2+3</call>"})
    with Gateway(policy) as gateway, GatewayServer(gateway) as server:
        stream = _ask(
            _client(server, "s-1"),
            MESSAGES,
            tools=[CALCULATOR_TOOL],
            tool_choice="required",
            stream=True,
            n=2,
        )
        calls: dict[int, list[Any]] = {}
        for chunk in stream:
            for choice in chunk.choices:
                calls.setdefault(choice.index, []).extend(choice.delta.tool_calls or [])
        assert sorted(calls) == [0, 1]
        for deltas in calls.values():
            (delta,) = deltas
            assert delta.function.name == "calculator"
            assert delta.function.arguments == '{"expression": "2+3"}'
        (record,) = gateway.views.rollout("s-1")["records"]
        assert record["forced"] == "<call>"
        assert [s["response"] for s in record["siblings"]] == ["2+3</call>"]
