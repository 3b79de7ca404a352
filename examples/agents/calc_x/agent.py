"""The calc_x agent stack of Agent Lightning's example, as an autogen user writes it.

autogen-agentchat's ``AssistantAgent`` with an ``McpWorkbench`` that starts the
``mcp-server-calculator`` package over stdio, and autogen-ext's OpenAI client.
Nothing here is turnrl-specific except where the base URL comes from: turnrl
hands it over in ``llm`` (entrypoint) or in ``OPENAI_BASE_URL`` (command:
``agent.command = [".venv-agents/bin/python", "examples/agents/calc_x/agent.py"]``,
an environment without turnrl; ``../calc_common.py`` reads it and prints the reward).
``reflect_on_tool_use=True``: after a tool call, autogen asks the model once more
(without tools) to turn the tool result into the reply.

Run under ``turnrl train --config examples/agents/calc_x/calc_x.toml``
(needs the ``agents`` extra: autogen-agentchat, autogen-ext[openai,mcp],
mcp-server-calculator).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/agents/calc_common

from autogen_agentchat.agents import AssistantAgent
from autogen_core.models import ModelFamily
from autogen_ext.models.openai import OpenAIChatCompletionClient
from autogen_ext.tools.mcp import McpWorkbench, StdioServerParams
from calc_common import is_correct, main

ANSWER_FORMAT = "Give the result as ### ANSWER: <number> ###."
ANSWER = re.compile(r"###\s*ANSWER:\s*(.+?)\s*(?:###|$)")

MODEL_INFO = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": ModelFamily.UNKNOWN,
    "structured_output": False,
}


def calculator_server() -> StdioServerParams:
    """The MCP calculator over stdio, started with this interpreter (the venv has it)."""
    return StdioServerParams(
        command=sys.executable, args=["-m", "mcp_server_calculator"], read_timeout_seconds=60
    )


async def solve(question: str, *, model: str, base_url: str, api_key: str) -> str:
    """One autogen run on ``question``; returns the agent's last message."""
    async with McpWorkbench(calculator_server()) as workbench:
        model_client = OpenAIChatCompletionClient(
            model=model, base_url=base_url, api_key=api_key, model_info=MODEL_INFO
        )
        agent = AssistantAgent(
            name="calc",
            model_client=model_client,
            workbench=workbench,
            reflect_on_tool_use=True,
        )
        try:
            result = await agent.run(task=f"{question} {ANSWER_FORMAT}")
        finally:
            await model_client.close()
    return str(result.messages[-1].content)


def score(task: dict[str, Any], reply: str) -> dict[str, Any]:
    match = ANSWER.search(reply)
    correct = match is not None and is_correct(match.group(1), float(task["answer"]))
    return {"reward": float(correct), "info": {"success": correct}}


async def run(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    """One autogen episode on ``task`` (``llm``: turnrl's ``LLM`` in-process,
    ``calc_common.Endpoint`` as a command)."""
    reply = await solve(
        task["question"], model=llm.model, base_url=llm.base_url, api_key=llm.api_key
    )
    return score(task, reply)


if __name__ == "__main__":
    main(run)
