"""A request extends the last turn only when it repeats the assistant reply the gateway
returned (role, text and tool calls); an agent that edits that reply rewrote history,
so its next turn is a rebuilt context, recorded and counted as one.

Driven in-process (``Gateway.complete``), with a scripted policy on the tiny tokenizer."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from serve_scripted import CALCULATOR_TOOL, ScriptedPolicy, calculator_reply
from turnrl.policy import build_tiny_policy
from turnrl.serve import Gateway, GatewayConfig, parse_chat_request

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def gateway() -> Any:
    with Gateway(ScriptedPolicy(build_tiny_policy(seed=0), calculator_reply), GatewayConfig()) as g:
        yield g


def _ask(gateway: Gateway, rollout_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One call with the calculator tool; returns the assistant message as the agent
    would send it back (OpenAI shape)."""
    body = {"model": "m", "messages": messages, "tools": [CALCULATOR_TOOL]}
    reply = gateway.complete(parse_chat_request(body), rollout_id)
    return reply["choices"][0]["message"]


def _edit_text(reply: dict[str, Any]) -> dict[str, Any]:
    return {**reply, "content": (reply.get("content") or "") + " (edited)"}


def _edit_call(reply: dict[str, Any]) -> dict[str, Any]:
    (call,) = reply["tool_calls"]
    edited = {**call["function"], "arguments": '{"expression": "2+2"}'}
    return {**reply, "tool_calls": [{**call, "function": edited}]}


def _second_turn(gateway: Gateway, rollout_id: str, edit) -> dict[str, Any]:
    question = {"role": "user", "content": "Compute 3*3."}
    reply = _ask(gateway, rollout_id, [question])
    assert reply["tool_calls"]  # the scripted policy calls the tool first
    sent_back = edit(reply)
    tool = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "9"}
    _ask(gateway, rollout_id, [question, sent_back, tool])
    return gateway.views.rollout(rollout_id)


def test_the_reply_sent_back_unchanged_extends_the_context(gateway: Gateway) -> None:
    before = gateway.registry.context_rebuilds
    rollout = _second_turn(gateway, "same", lambda reply: reply)
    first, second = rollout["records"]
    assert second["context_rebuilt"] is False
    assert rollout["context_rebuilds"] == 0
    assert gateway.registry.context_rebuilds == before
    # The kept ids: turn 0's context and sampled response, then the tool message.
    observation = gateway.policy.encode_observation({"role": "tool", "content": "9"})
    assert second["prompt_ids"] == [*first["prompt_ids"], *first["response_ids"], *observation]


@pytest.mark.parametrize("edit", [_edit_text, _edit_call], ids=["text", "tool_call"])
def test_an_edited_assistant_reply_is_a_counted_rebuild(gateway: Gateway, edit) -> None:
    rollout_id = f"edited-{edit.__name__}"
    before = gateway.registry.context_rebuilds
    rollout = _second_turn(gateway, rollout_id, edit)
    second = rollout["records"][1]
    assert second["context_rebuilt"] is True
    assert rollout["context_rebuilds"] == 1
    assert gateway.registry.context_rebuilds == before + 1
    # Rebuilt from the messages as sent, not from the tokens the policy sampled.
    assert second["prompt_ids"] == gateway.policy.encode_initial(second["prompt"])
