"""A calculator agent written with LangGraph, unchanged: the tool-calling graph of its docs.

A ``StateGraph`` over ``MessagesState`` with two nodes: the model
(LangChain's ``ChatOpenAI`` with the calculator bound as a tool) and
LangGraph's prebuilt ``ToolNode``; ``tools_condition`` routes to the tools while
the model asks for them, else ends. Only the base URL, key and model name come
from turnrl (the rollout's). The calculator runs turnrl's safe arithmetic,
never ``eval`` (``calc_common.py``: no turnrl import).

``agent.entrypoint = "examples/agents/calc_langgraph.py:run"``; as a program in its
own venv (``agent.command = [".venv-agents/bin/python",
"examples/agents/calc_langgraph.py"]``) it prints ``{"reward": ...}``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # calc_common, beside this file

from calc_common import calculator as safe_calculator
from calc_common import main, score
from langchain_core.messages import SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

SYSTEM_PROMPT = "Solve the arithmetic problem. Reply with the number only."
RECURSION_LIMIT = 8
"""Graph steps per episode (each model call and each tool round is one)."""


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. 123*456."""
    return safe_calculator(expression)


def build_graph(model: ChatOpenAI) -> Any:
    """The model node and the tool node, looping while the model calls tools."""
    llm = model.bind_tools([calculator])

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke([SystemMessage(SYSTEM_PROMPT), *state["messages"]])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([calculator]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


def solve(question: str, base_url: str, api_key: str, model: str) -> str:
    """One episode; the last message's text ("" when the step limit cut it off)."""
    chat = ChatOpenAI(model=model, base_url=base_url, api_key=api_key, max_retries=0)
    graph = build_graph(chat)
    try:
        state = graph.invoke(
            {"messages": [("user", question)]}, {"recursion_limit": RECURSION_LIMIT}
        )
    except GraphRecursionError:  # the step limit: no answer, reward 0
        return ""
    content = state["messages"][-1].content
    return content if isinstance(content, str) else ""


def run(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    """One LangGraph episode on ``task`` through the rollout's URL (``llm``: turnrl's
    ``LLM`` in-process, ``calc_common.Endpoint`` as a command)."""
    return score(task, solve(task["question"], llm.base_url, llm.api_key, llm.model))


if __name__ == "__main__":
    main(run)
