"""A calculator agent written with smolagents' ``CodeAgent`` over LiteLLM, unchanged.

The model writes Python in ``<code>...</code>`` blocks (smolagents' default tags);
smolagents runs it with its ``LocalPythonExecutor``, which can call the agent's
tools (here the safe calculator of ``calc_smolagents.py``) and ``final_answer``.
``CodeAgent`` sends no ``tools`` to the model (the tools are Python functions in its
prompt) and ``stop=["Observation:", "Calling tools:", "</code>"]``; it appends the
closing tag the stop string cut off, so the reply it sends back differs from the
sampled one and the gateway records that turn as a rebuild (``context_rebuilt``).

Trust. The code the policy writes is untrusted and is run here, in the agent's
process: the only barrier is smolagents' ``LocalPythonExecutor``, an AST
interpreter (not ``exec``) that allows only the listed imports, refuses dunder
access and bounds work (10 million operations, 1 million ``while`` iterations,
30 s per code block), plus the agent loop's own ``agent.timeout_s`` per rollout,
enforced from outside the agent (its rollout closed and counted as a failure, its
thread abandoned). It is not an operating-system sandbox: for
untrusted models run the agent as a program (``agent.command``) in a container,
or use smolagents' remote executors (``executor_type="docker"``, ``"e2b"``...).
See docs/agents.md "smolagents CodeAgent".

Defaults kept: ``LiteLLMModel`` and ``CodeAgent`` as they come. One option set: a
short system prompt (``prompt_templates``), because smolagents' default code-agent
prompt is longer than the tiny test model's context; a real model keeps the
default.

``agent.entrypoint = "examples/agents/calc_smolagents_code.py:run"``.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path
from typing import Any

import yaml

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from smolagents import CodeAgent, LiteLLMModel

from turnrl.entrypoints import load_object

_TOOL_CALLING = f"{Path(__file__).with_name('calc_smolagents.py')}:"
calculator = load_object(_TOOL_CALLING + "calculator", "calc_smolagents_code")
score = load_object(_TOOL_CALLING + "score", "calc_smolagents_code")

SYSTEM_PROMPT = (
    "Solve the arithmetic problem. Write Python between <code> and </code>: "
    "call calculator(expression), then final_answer(result)."
)
MAX_STEPS = 2


def prompt_templates() -> dict[str, Any]:
    """smolagents' code-agent templates with the short system prompt."""
    text = importlib.resources.files("smolagents.prompts").joinpath("code_agent.yaml")
    templates = yaml.safe_load(text.read_text())
    return {**templates, "system_prompt": SYSTEM_PROMPT}


def solve(question: str, base_url: str, api_key: str, model: str) -> str:
    """One CodeAgent episode; the final answer as text ("" when there is none)."""
    llm = LiteLLMModel(model_id=f"openai/{model}", api_base=base_url, api_key=api_key)
    agent = CodeAgent(
        tools=[calculator],
        model=llm,
        max_steps=MAX_STEPS,
        verbosity_level=0,
        prompt_templates=prompt_templates(),
    )
    answer = agent.run(question)
    return "" if answer is None else str(answer)


def run(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    """turnrl entrypoint: one CodeAgent episode on ``task`` through the rollout's URL."""
    result: dict[str, Any] = score(
        task, solve(task["question"], llm.base_url, llm.api_key, llm.model)
    )
    return result
