"""Two agents in one program: a solver (with a calculator tool) and a checker.

The solver answers the question, calling the calculator when it wants; the
checker reads the question and the proposed answer and says yes or no; on a no,
the solver gets one more try. Both are the same policy, asked for under
different model names (``"solver"``, ``"checker"``): the gateway records the
name as each turn's ``role``, so ``credit.estimator = "role_turn"`` (AT-GRPO)
groups solver turns with solver turns and checker turns with checker turns.
The reward (1 for a correct final answer) is shared by both.

``agent.entrypoint = "examples/agents/solver_checker.py:run"``; the warm start's
teacher is :func:`teach` below.
"""

from __future__ import annotations

import json
from typing import Any

from openai import OpenAI

from turnrl.envs.calculator import is_correct, parse_number
from turnrl.envs.safe_math import calculate
from turnrl.envs.tools import run_with_timeout

SOLVER_PROMPT = "Solve the arithmetic problem. Reply with the number only."
CHECKER_PROMPT = "Is the proposed answer right? Reply yes or no."
RETRY = "The checker says no. Try again."
MAX_CALLS = 3

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
    try:
        expression = str(json.loads(arguments).get("expression", ""))
    except (json.JSONDecodeError, AttributeError):
        return "error: arguments must be a JSON object with an expression"
    result = run_with_timeout(calculate, expression, timeout_s=2.0)
    return result.output if result.error is None else f"error: {result.error}"


def solver_turns(client: OpenAI, messages: list[Any]) -> str:
    """The solver's function-calling loop on ``messages`` (extended in place)."""
    for _ in range(MAX_CALLS):
        response = client.chat.completions.create(model="solver", messages=messages, tools=TOOLS)
        message = response.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": calculator(call.function.arguments),
                }
            )
    return ""


def checker_says_yes(client: OpenAI, question: str, proposed: str) -> bool:
    messages = [
        {"role": "system", "content": CHECKER_PROMPT},
        {"role": "user", "content": f"{question} Proposed: {proposed}"},
    ]
    response = client.chat.completions.create(model="checker", messages=messages)
    return (response.choices[0].message.content or "").strip().lower().startswith("yes")


def run(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    client = llm.openai_client()
    messages: list[Any] = [
        {"role": "system", "content": SOLVER_PROMPT},
        {"role": "user", "content": task["question"]},
    ]
    reply = solver_turns(client, messages)
    accepted = checker_says_yes(client, task["question"], reply)
    if not accepted:
        messages.append({"role": "user", "content": RETRY})
        reply = solver_turns(client, messages)
    correct = is_correct(reply, float(task["answer"]))
    return {"reward": float(correct), "info": {"success": correct, "accepted": accepted}}


# --------------------------------------------------------------------------- the teacher


def teach(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], task: dict[str, Any]
) -> dict[str, Any]:
    """Scripted replies for the warm start.

    The checker says yes exactly when the proposed number is right. The solver, on
    a hard problem, first guesses (the product rounded to hundreds, usually wrong);
    told to try again, it calls the calculator and answers with the result. Easy
    problems it answers directly. So the demonstrations hold both verdicts.
    """
    if messages[0]["content"] == CHECKER_PROMPT:
        proposed = messages[-1]["content"].rsplit("Proposed:", 1)[-1]
        value = parse_number(proposed)
        right = value is not None and is_correct(proposed, float(task["answer"]))
        return {"role": "assistant", "content": "yes" if right else "no"}
    answer = int(task["answer"])
    hard = "hard" in task.get("tags", [])
    retried = any(m.get("content") == RETRY for m in messages)
    called = any(m.get("role") == "tool" for m in messages)
    if not hard or called:
        return {"role": "assistant", "content": str(answer)}
    if not retried:
        return {"role": "assistant", "content": str(round(answer, -2))}
    arguments = json.dumps({"expression": task["expression"]})
    call = {"id": "call_teacher", "type": "function"}
    call["function"] = {"name": tools[0]["function"]["name"], "arguments": arguments}
    return {"role": "assistant", "content": None, "tool_calls": [call]}
