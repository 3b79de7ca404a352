"""A calculator agent written with the OpenAI Agents SDK (``openai-agents``), unchanged.

One ``Agent`` with one ``@function_tool``, run by ``Runner.run``; the SDK's
chat-completions model is given an ``AsyncOpenAI`` client whose base URL is the
rollout's, which is all turnrl needs. Tracing is off (it would export to
OpenAI's servers). The tool runs turnrl's safe arithmetic, never ``eval``
(``calc_common.py``: no turnrl import).

``agent.entrypoint = "examples/agents/calc_agents_sdk.py:run"``; as a program in its
own venv (``agent.command = [".venv-agents/bin/python",
"examples/agents/calc_agents_sdk.py"]``) it prints ``{"reward": ...}``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # calc_common, beside this file

from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
from calc_common import calculator as safe_calculator
from calc_common import main, score
from openai import AsyncOpenAI

INSTRUCTIONS = "Solve the arithmetic problem. Reply with the number only."


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: the expression, e.g. 123*456.
    """
    return safe_calculator(expression)


async def solve(question: str, client: AsyncOpenAI, model: str) -> str:
    agent = Agent(
        name="calculator agent",
        instructions=INSTRUCTIONS,
        tools=[calculator],
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
    )
    result = await Runner.run(
        agent, question, max_turns=4, run_config=RunConfig(tracing_disabled=True)
    )
    return str(result.final_output)


async def run(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    """One Agents-SDK episode on ``task`` (``llm``: turnrl's ``LLM`` in-process,
    ``calc_common.Endpoint`` as a command; both give ``async_openai_client()``)."""
    return score(task, await solve(task["question"], llm.async_openai_client(), llm.model))


if __name__ == "__main__":
    main(run)
