"""A calculator agent written with the official ``openai`` client, the documented way.

Nothing in the agent knows about turnrl: it is the function-calling loop of the
OpenAI docs (send the conversation and the tools, run the tool calls the model
asks for, send the results back, stop at a plain reply). turnrl only provides
the base URL, so every call is sampled from the policy being trained and
recorded as a turn. The calculator tool runs turnrl's safe arithmetic
(``turnrl.envs.safe_math``: parsed, never ``eval``) with a time limit.

Two ways to run it under ``turnrl train`` (see examples/agents/calc_openai.toml):

* in-process: ``agent.entrypoint = "examples/agents/calc_openai.py:run"``
* as a program: ``agent.command = ["python", "examples/agents/calc_openai.py"]``
  (reads ``OPENAI_BASE_URL``/``OPENAI_API_KEY``/``OPENAI_MODEL``/``TURNRL_TASK``
  and prints ``{"reward": ...}`` as its last line)
"""

from __future__ import annotations

import json
import os
from typing import Any

from openai import OpenAI

from turnrl.envs.calculator import is_correct
from turnrl.envs.safe_math import calculate
from turnrl.envs.tools import run_with_timeout

SYSTEM_PROMPT = "Solve the arithmetic problem. Reply with the number only."
MAX_CALLS = 4

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "evaluates arithmetic",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


def calculator(arguments: str) -> str:
    """Run the calculator tool on the model's JSON arguments; errors become the result text."""
    try:
        expression = json.loads(arguments).get("expression", "")
    except (json.JSONDecodeError, AttributeError):
        return "error: arguments must be a JSON object with an expression"
    result = run_with_timeout(calculate, str(expression), timeout_s=2.0)
    return result.output if result.error is None else f"error: {result.error}"


def solve(client: OpenAI, model: str, question: str) -> tuple[str, int]:
    """The function-calling loop; returns the final reply and how many tool calls ran."""
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question},
    ]
    tool_calls = 0
    for _ in range(MAX_CALLS):
        response = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        message = response.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            return message.content or "", tool_calls
        for call in message.tool_calls:
            tool_calls += 1
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": calculator(call.function.arguments),
                }
            )
    return "", tool_calls


def score(task: dict[str, Any], reply: str, tool_calls: int) -> dict[str, Any]:
    correct = is_correct(reply, float(task["answer"]))
    return {"reward": float(correct), "info": {"success": correct, "tool_calls": tool_calls}}


def run(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    """turnrl entrypoint: one episode on ``task`` through ``llm`` (the rollout's base URL)."""
    reply, tool_calls = solve(llm.openai_client(), llm.model, task["question"])
    return score(task, reply, tool_calls)


if __name__ == "__main__":
    task = json.loads(os.environ["TURNRL_TASK"])
    client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    reply, tool_calls = solve(client, os.environ["OPENAI_MODEL"], task["question"])
    print(json.dumps(score(task, reply, tool_calls)))
