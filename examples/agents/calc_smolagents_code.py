"""A calculator agent written with smolagents' ``CodeAgent``, unchanged.

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

Defaults kept: ``CodeAgent`` and its model (``OpenAIServerModel``, as in
``calc_smolagents.py``) as they come. One option set: a
short system prompt (``prompt_templates``), because smolagents' default code-agent
prompt is longer than the tiny test model's context; a real model keeps the
default.

``agent.entrypoint = "examples/agents/calc_smolagents_code.py:run"``; as a program in
its own venv (``agent.command = [".venv-agents/bin/python",
"examples/agents/calc_smolagents_code.py"]``) it prints ``{"reward": ...}``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this file

from calc_common import main, score
from calc_smolagents import prompt_templates, solve
from smolagents import CodeAgent

SYSTEM_PROMPT = (
    "Solve the arithmetic problem. Write Python between <code> and </code>: "
    "call calculator(expression), then final_answer(result)."
)


def run(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    """One CodeAgent episode on ``task`` through the rollout's URL (the tool-calling
    example's ``solve`` with ``CodeAgent`` and the code-agent templates)."""
    templates = prompt_templates("code_agent.yaml", SYSTEM_PROMPT)
    reply = solve(
        task["question"],
        llm.base_url,
        llm.api_key,
        llm.model,
        agent_class=CodeAgent,
        templates=templates,
    )
    return score(task, reply)


if __name__ == "__main__":
    main(run)
