"""A calculator agent written with the OpenAI Agents SDK (``openai-agents``), unchanged.

One ``Agent`` with one ``@function_tool``, run by ``Runner.run``; the SDK's
chat-completions model is given an ``AsyncOpenAI`` client whose base URL is the
rollout's, which is all turnrl needs. Tracing is off (it would export to
OpenAI's servers). The tool runs turnrl's safe arithmetic, never ``eval``.

``agent.entrypoint = "examples/agents/calc_agents_sdk.py:run"``.
"""

from __future__ import annotations

from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
from openai import AsyncOpenAI

from turnrl.envs.calculator import is_correct
from turnrl.envs.safe_math import SafeMathError, calculate

INSTRUCTIONS = "Solve the arithmetic problem. Reply with the number only."


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: the expression, e.g. 123*456.
    """
    try:
        return calculate(expression)
    except SafeMathError as exc:
        return f"error: {exc}"


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
    """turnrl entrypoint: one Agents-SDK episode on ``task``."""
    reply = await solve(task["question"], llm.async_openai_client(), llm.model)
    correct = is_correct(reply, float(task["answer"]))
    return {"reward": float(correct), "info": {"success": correct}}
