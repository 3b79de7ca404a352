"""A calculator agent written with smolagents: a ``ToolCallingAgent``, unchanged.

The agent is smolagents' own tool-calling loop (``ToolCallingAgent`` with one
``@tool``), its model smolagents' class for an OpenAI-compatible server
(``OpenAIServerModel``) pointed at the rollout's base URL with the run's key: what a
new user writes to put an existing smolagents agent behind such a server. It sends
``stop=["Observation:", "Calling tools:"]`` on every call; the gateway ends the
response where a stop string completes and records exactly the tokens sampled up to
there (docs/gateway.md).

The model class keeps smolagents' default ``tool_choice="required"`` (every smolagents
API model sends it, ``LiteLLMModel`` too): the gateway forces the call by writing the
call's start into the context and the policy samples the rest (the forced tokens are
recorded as prompt, never trained; docs/gateway.md "Forced tool calls"). The one
setting changed is smolagents' own option, not code: a short system prompt
(``prompt_templates``): smolagents' default one is about 3,800 characters, more than
the tiny test model's context. A real model keeps the default.

``OpenAIServerModel`` rather than ``LiteLLMModel``: both send the same OpenAI chat
request here (LiteLLM's ``openai/`` provider goes through the same ``openai`` client),
but importing LiteLLM costs about 8 s of CPU, paid by every rollout of a command agent
(a fresh interpreter each). The calculator runs turnrl's safe arithmetic, never
``eval`` (``calc_common.py``: no turnrl import).

``agent.entrypoint = "examples/agents/calc_smolagents.py:run"``; as a program in its
own venv (``agent.command = [".venv-agents/bin/python",
"examples/agents/calc_smolagents.py"]``, docs/agents.md "An agent in its own venv") it
reads the task and endpoint turnrl gives a command and prints ``{"reward": ...}``.
"""

from __future__ import annotations

import importlib.resources
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # calc_common, beside this file

from calc_common import calculator as safe_calculator
from calc_common import main, score
from smolagents import OpenAIServerModel, ToolCallingAgent, tool

SYSTEM_PROMPT = (
    "Solve the arithmetic problem. Call the calculator, then final_answer with the number."
)
MAX_STEPS = 2


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: the expression, e.g. 123*456.
    """
    return safe_calculator(expression)


def prompt_templates(
    name: str = "toolcalling_agent.yaml", system_prompt: str = SYSTEM_PROMPT
) -> dict[str, Any]:
    """smolagents' templates ``name`` (its ``prompts`` package) with a short system prompt."""
    text = importlib.resources.files("smolagents.prompts").joinpath(name)
    templates = yaml.safe_load(text.read_text())
    return {**templates, "system_prompt": system_prompt}


def solve(
    question: str,
    base_url: str,
    api_key: str,
    model: str,
    *,
    agent_class: type = ToolCallingAgent,
    templates: dict[str, Any] | None = None,
) -> str:
    """One smolagents episode of ``agent_class`` (with the calculator tool, at most
    ``MAX_STEPS`` steps); the final answer as text ("" when there is none)."""
    llm = OpenAIServerModel(model_id=model, api_base=base_url, api_key=api_key)
    agent = agent_class(
        tools=[calculator],
        model=llm,
        max_steps=MAX_STEPS,
        verbosity_level=0,
        prompt_templates=templates or prompt_templates(),
    )
    answer = agent.run(question)
    return "" if answer is None else str(answer)


def run(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    """One smolagents episode on ``task`` through the rollout's URL (``llm``: turnrl's
    ``LLM`` in-process, ``calc_common.Endpoint`` as a command)."""
    return score(task, solve(task["question"], llm.base_url, llm.api_key, llm.model))


if __name__ == "__main__":
    main(run)
