"""A scripted teacher for the calculator agents' warm start (``warm_start.teacher``).

Given a call's messages, the tools the agent offered and the task, it returns the
assistant message an ideal agent would send: on half of the hard problems
(3-digit multiplications; which half is fixed by the task id) it calls the
agent's first tool with the expression, then answers with the number; otherwise
it answers the number directly. Under ``warm_start.mix = "per_draw"`` the agent loop
runs each task once per variant of the calculator's demonstrations (the tool on
``warm_start.tool_fraction`` of hard problems and ``easy_tool_fraction`` of easy
ones, weighted by those shares: :mod:`turnrl.train.agent.teacher_mix`) and the task
carries the variant's ``demo`` options, which the teacher follows. The agent runs
against it behind turnrl's gateway, so the demonstrations are the exact prompts and
token ids the agent produces, with nothing written by hand here but the replies.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

TOOL_SHARE_HARD = 0.5
"""Share of hard problems on which the teacher calls the tool (the rest it answers
directly, so RL has something to learn: calling the tool where it pays)."""


def uses_tool(task: dict[str, Any], share: float = TOOL_SHARE_HARD) -> bool:
    """Whether the teacher calls the tool on ``task``: as the per-draw variant it carries
    says (``task["demo"]["use_tool"]``), else on a ``share`` of hard tasks fixed per task id."""
    demo = task.get("demo")
    if isinstance(demo, dict) and "use_tool" in demo:
        return bool(demo["use_tool"])
    if "hard" not in task.get("tags", []):
        return False
    digest = hashlib.sha256(task["task_id"].encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < share


def tool_call(tools: list[dict[str, Any]], expression: str) -> dict[str, Any]:
    """An assistant message calling the first tool with ``expression`` as its first parameter."""
    function = tools[0]["function"]
    parameters = function.get("parameters", {})
    name = (parameters.get("required") or list(parameters.get("properties", {})) or ["input"])[0]
    arguments = json.dumps({name: expression})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_teacher",
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        ],
    }


def answer_text(task: dict[str, Any]) -> str:
    return str(task["answer"])


def teach(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], task: dict[str, Any]
) -> dict[str, Any]:
    """The reply to one call: a tool call first where the teacher uses the tool, else the answer."""
    called = any(m.get("role") == "tool" for m in messages)
    if tools and not called and uses_tool(task):
        return tool_call(tools, task["expression"])
    return {"role": "assistant", "content": answer_text(task)}


def worked_answer(task: dict[str, Any]) -> str:
    """The answer with its expression before it, ``"2 + 8 = 10"`` (the reply's last number
    is what the agent's reward reads): the form in which SmolLM2-135M-Instruct already
    does single-digit sums. Asked for the number alone, the warm-started model answered
    easy problems at random (a pilot of 2026-12-07, docs/grouping-experiment.md); given
    the ``a op b = `` prefix the base model completes 135 of the 155 single-digit sums
    and differences greedily."""
    spaced = re.sub(r"(?<=\d)\s*([-+*/])\s*", r" \1 ", task["expression"])
    return f"{spaced} = {answer_text(task)}"


def teach_worked(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], task: dict[str, Any]
) -> dict[str, Any]:
    """:func:`teach`, with a direct answer written out as :func:`worked_answer` (after a
    tool call the reply is still the number)."""
    reply = teach(messages, tools, task)
    called = any(m.get("role") == "tool" for m in messages)
    if reply.get("tool_calls") or called:
        return reply
    return {"role": "assistant", "content": worked_answer(task)}


def teach_calc_x(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], task: dict[str, Any]
) -> dict[str, Any]:
    """The same teacher for the autogen calc_x agent, answering in its requested format.

    autogen sends the conversation and the MCP tools; after a tool call it asks once
    more without tools (``reflect_on_tool_use``), and the teacher answers then.
    """
    reply = teach(messages, tools, task)
    if reply.get("tool_calls"):
        return reply
    return {"role": "assistant", "content": f"### ANSWER: {answer_text(task)} ###"}
