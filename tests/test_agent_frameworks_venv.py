"""The agent frameworks trained from a venv of their own, without turnrl.

A user's agent lives in its own environment. ``make setup-agents`` builds
``.venv-agents`` from requirements/agents.txt (the frameworks, no turnrl, no torch);
here each example of examples/agents/ (smolagents' ``ToolCallingAgent`` and
``CodeAgent``, LangGraph, the OpenAI Agents SDK, autogen's calc_x) trains for 2 steps
as ``agent.command = [".venv-agents/bin/python", "examples/agents/<agent>.py"]``,
with what tests/test_agent_frameworks.py asserts of the same agent in-process.
Skipped, with the reason, where ``.venv-agents`` is absent.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from test_agent_frameworks import (
    AGENTS,
    check_agents_sdk_run,
    check_calc_x_run,
    check_code_agent_run,
    check_langgraph_run,
    check_smolagents_tool_calling_run,
    train_two_steps,
)
from turnrl.envs.calculator import is_correct
from turnrl.envs.safe_math import SafeMathError, calculate

AGENTS_PYTHON = AGENTS.parents[1] / ".venv-agents" / "bin" / "python"

needs_agents_venv = pytest.mark.skipif(
    not AGENTS_PYTHON.exists(),
    reason=f"{AGENTS_PYTHON} is absent: `make setup-agents` builds the agents' own venv",
)


def _calc_common() -> Any:
    """examples/agents/calc_common.py, what the examples share (no turnrl import), under
    the name the examples import it by."""
    if "calc_common" not in sys.modules:
        spec = importlib.util.spec_from_file_location("calc_common", AGENTS / "calc_common.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["calc_common"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["calc_common"]


calc_common = _calc_common()


def _agents_python(code: str, **environ: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by the agents' interpreter with the environment a command agent
    inherits (this process's, plus ``environ``)."""
    return subprocess.run(
        [str(AGENTS_PYTHON), "-c", code],
        env={**os.environ, **environ},
        capture_output=True,
        text=True,
        timeout=120,
    )


@needs_agents_venv
def test_the_agents_venv_has_neither_turnrl_nor_torch() -> None:
    """The separation the tests below rely on: the agents' interpreter, with the
    environment a command agent inherits, cannot import turnrl (nor torch)."""
    for module in ("turnrl", "torch"):
        result = _agents_python(f"import {module}")
        assert result.returncode == 1
        assert f"No module named '{module}'" in result.stderr


@pytest.mark.slow
@needs_agents_venv
def test_the_agents_venv_imports_every_framework_in_one_interpreter() -> None:
    """Every framework of requirements/agents.txt (LiteLLM too, which no example uses)
    imports in one interpreter of ``.venv-agents``. Slow (about 17 s of imports): in
    ``make test`` each example imports its own framework there when it trains
    (test_a_framework_agent_trains_two_steps_from_its_own_venv, all five), and
    test_the_agents_venv_has_neither_turnrl_nor_torch checks the separation."""
    frameworks = "smolagents, litellm, langgraph, langchain_openai, agents, autogen_agentchat"
    modules = f"{frameworks}, autogen_ext.tools.mcp, mcp_server_calculator"
    # LiteLLM fetches a price list from GitHub when imported unless told not to.
    result = _agents_python(f"import {modules}", LITELLM_LOCAL_MODEL_COST_MAP="True")
    assert result.returncode == 0, result.stderr


def _train_command(tmp_path: Path, example: Path) -> Path:
    command = json.dumps([str(AGENTS_PYTHON), str(example)])
    # A fresh interpreter per rollout imports its framework (several seconds of CPU on
    # a loaded machine): a longer rollout limit than the in-process tests'.
    return train_two_steps(tmp_path, f"agent.command={command}", "agent.timeout_s=300")


EXAMPLES: dict[str, tuple[str, Callable[[Path], None]]] = {
    "smolagents ToolCallingAgent": ("calc_smolagents.py", check_smolagents_tool_calling_run),
    "smolagents CodeAgent": ("calc_smolagents_code.py", check_code_agent_run),
    "LangGraph": ("calc_langgraph.py", check_langgraph_run),
    "OpenAI Agents SDK": ("calc_agents_sdk.py", check_agents_sdk_run),
    "autogen calc_x": ("calc_x/agent.py", check_calc_x_run),
}


@needs_agents_venv
@pytest.mark.parametrize("framework", list(EXAMPLES))
def test_a_framework_agent_trains_two_steps_from_its_own_venv(
    tmp_path: Path, framework: str
) -> None:
    example, check = EXAMPLES[framework]
    check(_train_command(tmp_path, AGENTS / example))


@needs_agents_venv
def test_the_documented_recipe_runs_the_sdk_agent_from_the_agents_venv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/agents.md "An agent in its own venv": the Agents SDK recipe with its
    entrypoint swapped for the command is a valid run config, its program checked."""
    from turnrl.train.agent.command import CommandProgram
    from turnrl.train.agent.programs import make_program
    from turnrl.train.config import RunConfig, load_config
    from turnrl.train.validate import validate

    monkeypatch.chdir(AGENTS.parents[1])  # the recipe's paths are from the repo root
    command = [".venv-agents/bin/python", "examples/agents/calc_agents_sdk.py"]
    overrides = ["agent.entrypoint=none", f"agent.command={json.dumps(command)}"]
    config = load_config(RunConfig, AGENTS / "calc_agents_sdk.toml", overrides)
    validate(config)
    assert config.agent.entrypoint is None and list(config.agent.command) == command
    program = make_program(config.agent.entrypoint, config.agent.command, config.agent.env)
    assert isinstance(program, CommandProgram)
    assert program.argv == command  # not swapped for turnrl's interpreter


@given(
    st.text(alphabet="0123456789+-.,eE xy", max_size=20),
    st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.integers(-(10**9), 10**9).map(float),
)
def test_the_examples_score_replies_as_turnrl_s_calculator_does(
    reply: str, expected: float
) -> None:
    assert calc_common.is_correct(reply, expected) == is_correct(reply, expected)
    assert calc_common.is_correct(f"it is {expected!r}", expected) is True


@given(st.text(alphabet="0123456789+-*/%() .x_", max_size=30))
def test_the_examples_calculator_is_turnrl_s_safe_arithmetic(expression: str) -> None:
    try:
        expected = calculate(expression)
    except SafeMathError as exc:
        expected = f"error: {exc}"
    assert calc_common.calculator(expression) == expected


def test_the_command_entry_reads_the_task_file_and_prints_the_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    task = tmp_path / "task.json"
    task.write_text(json.dumps({"question": "Compute 6*7.", "answer": 42}))
    monkeypatch.setenv("TURNRL_TASK_FILE", str(task))
    monkeypatch.setenv("TURNRL_TASK", '{"question": "not this one"}')
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/rollouts/r/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "key")
    monkeypatch.setenv("OPENAI_MODEL", "turnrl")
    seen: list[tuple[dict[str, Any], Any]] = []

    async def agent(task: dict[str, Any], llm: Any) -> dict[str, Any]:
        seen.append((task, llm))
        return calc_common.score(task, "The answer is 42.")

    calc_common.main(agent)
    assert seen == [
        (
            {"question": "Compute 6*7.", "answer": 42},
            calc_common.Endpoint("http://127.0.0.1:1/rollouts/r/v1", "key", "turnrl"),
        )
    ]
    last = capsys.readouterr().out.splitlines()[-1]
    assert json.loads(last) == {"reward": 1.0, "info": {"success": True}}
