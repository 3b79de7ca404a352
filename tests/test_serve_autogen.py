"""autogen-agentchat's AssistantAgent against the gateway, unchanged (skips without autogen).

The two failures issue 14 saw with autogen: the reflection call after a tool
result (``reflect_on_tool_use``) carries no ``tools`` and became a context
rebuild; and streamed deltas holding both content and ``tool_calls`` lost the
tool call. Here a scripted policy calls the calculator, autogen runs the tool
and reflects, streamed and not: both turns stay prefix-exact and the tool call
arrives.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from serve_scripted import ScriptedPolicy, assert_exact_prefixes, calculator_reply
from turnrl.envs.safe_math import calculate
from turnrl.policy import build_tiny_policy
from turnrl.serve import Gateway, GatewayServer

agents = pytest.importorskip("autogen_agentchat.agents", reason="autogen-agentchat not installed")
models = pytest.importorskip("autogen_ext.models.openai", reason="autogen-ext not installed")
core_models = pytest.importorskip("autogen_core.models")

torch.set_num_threads(1)


def calculator(expression: str) -> str:
    """evaluates arithmetic"""
    return calculate(expression)


async def _run_agent(base_url: str, api_key: str, *, stream: bool) -> list[object]:
    client = models.OpenAIChatCompletionClient(
        model="calc",
        base_url=base_url,
        api_key=api_key,
        model_info={
            "vision": False,
            "function_calling": True,
            "json_output": False,
            "family": core_models.ModelFamily.UNKNOWN,
            "structured_output": False,
        },
    )
    agent = agents.AssistantAgent(
        name="calc",
        model_client=client,
        tools=[calculator],
        reflect_on_tool_use=True,
        model_client_stream=stream,
    )
    try:
        result = await agent.run(task="Compute 12*13.")
    finally:
        await client.close()
    return list(result.messages)


@pytest.mark.parametrize("stream", [False, True])
def test_autogen_reflection_and_streamed_tool_calls(stream: bool) -> None:
    policy = ScriptedPolicy(build_tiny_policy(seed=0), calculator_reply)
    with Gateway(policy) as gateway, GatewayServer(gateway) as server:
        messages = asyncio.run(
            _run_agent(server.base_url("autogen-1"), server.api_key, stream=stream)
        )
        records = gateway.views.rollout("autogen-1")["records"]
    kinds = [type(m).__name__ for m in messages]
    assert "ToolCallExecutionEvent" in kinds  # the tool call reached autogen and ran
    assert getattr(messages[-1], "content", None) == "<answer>156</answer>"
    assert [r["response"] for r in records] == ["Let me<call>12*13</call>", "<answer>156</answer>"]
    assert [r["context_rebuilt"] for r in records] == [False, False]
    assert_exact_prefixes(records, policy.eos_token_id)
    assert {r["role"] for r in records} == {"calc"}
    assert records[1]["prompt"][-1] == {"role": "tool", "content": "156"}
