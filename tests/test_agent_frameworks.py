"""Agent frameworks a new user brings, trained unchanged through ``turnrl train``.

From examples/agents/, with each framework's defaults: a smolagents
``ToolCallingAgent`` (``stop`` and ``tool_choice="required"`` on every call), a
smolagents ``CodeAgent`` (it runs the code the policy writes), a LangGraph
tool-calling graph over ``ChatOpenAI``, the OpenAI Agents SDK and autogen's calc_x
stack (an MCP calculator over stdio), each trained for 2 steps on the tiny model with
calculator tasks. An agent whose call the gateway refused would fail its episode, and
the run would stop; so a finished run with no failed episode shows every call was
served.

The same agents run as commands from a venv of their own, without turnrl
(tests/test_agent_frameworks_venv.py): the ``check_*`` functions below are what
both versions assert of a run. The five in-process 2-step trainings here are marked
slow (``make test-slow``): ``make test`` runs the command versions, which call the
same ``run(task, llm)`` functions and assert the same ``check_*``; the in-process
entry stays covered there by test_agent_teacher (Agents SDK, calc_x) and the
CodeAgent tests below.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from turnrl.cli import main as turnrl_main
from turnrl.entrypoints import load_object
from turnrl.policy import build_tiny_policy
from turnrl.table import TurnTable

torch.set_num_threads(1)

AGENTS = Path(__file__).resolve().parents[1] / "examples" / "agents"

TASKS_PER_STEP = 1
GROUP_SIZE = 2
EPISODES_PER_STEP = TASKS_PER_STEP * GROUP_SIZE
"""Rollouts of each training step: one group of two, the least that has a group
(every rollout of a command agent starts a fresh interpreter of its framework)."""

TWO_STEPS = (
    "tasks.train=calculator",
    "tasks.n_train=8",
    "tasks.n_eval=1",  # the loop always evaluates after the warm start and at the end
    "warm_start.steps=0",
    f"rollout.tasks_per_step={TASKS_PER_STEP}",
    f"rollout.group_size={GROUP_SIZE}",
    "policy.max_new_tokens=8",
    "train.steps=2",
    "train.eval_every=2",
    "train.checkpoint_every=1",
    "train.minibatch_size=4",
    "train.threads=1",
    "agent.concurrency=4",
    "agent.timeout_s=120",
)


needs_smolagents = pytest.mark.skipif(
    importlib.util.find_spec("smolagents") is None or importlib.util.find_spec("openai") is None,
    reason="needs the agents extra (smolagents, openai)",
)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _ids(text: str) -> list[int]:
    """Ids of ``text`` in the tiny model's character-level tokenizer."""
    return build_tiny_policy(seed=0).chat.encode_text(text)


def train_two_steps(tmp_path: Path, *agent: str) -> Path:
    """A finished 2-step run of the agent the ``agent.*`` overrides ``agent`` name.

    Through ``turnrl train`` with ``logging.report=false`` (the HTML report is about 4 s
    of plotting, the same for every agent; an agent run's report is made in
    test_agent_loop's test_an_entrypoint_agent_trains_and_its_records_are_what_it_sent_and_got
    through ``turnrl report``)."""
    run = tmp_path / "run"
    args = ["train", "--quiet", "--run-dir", str(run), *TWO_STEPS, "logging.report=false"]
    assert turnrl_main([*args, *agent]) == 0
    assert not (run / "report.html").exists()
    return run


def _train(tmp_path: Path, entrypoint: str) -> Path:
    return train_two_steps(tmp_path, f"agent.entrypoint={entrypoint}")


def _check_run(run: Path, system_prompt: str, max_turns: int) -> list[list[dict[str, Any]]]:
    """Two updates from this agent's own calls; the rollouts of both steps."""
    metrics = _jsonl(run / "metrics.jsonl")
    trained = [m for m in metrics if m["step"] > 0]
    assert [m["step"] for m in trained] == [1, 2]
    assert [m["policy_version"] for m in trained] == [1, 2]
    assert [m["episodes"] for m in trained] == [EPISODES_PER_STEP] * 2
    assert [m["agent_failures"] for m in trained] == [0, 0]
    assert not (run / "agent_failures.jsonl").exists()
    rollouts = []
    for step in (1, 2):
        records = _jsonl(run / "rollouts" / f"step-{step:06d}.jsonl")
        TurnTable.from_records(records)  # valid turn records
        by_rollout: dict[str, list[dict[str, Any]]] = {}
        for record in records:
            by_rollout.setdefault(record["traj_id"], []).append(record)
        assert len(by_rollout) == EPISODES_PER_STEP
        for turns in by_rollout.values():
            assert [r["turn"] for r in turns] == list(range(len(turns)))
            assert 1 <= len(turns) <= max_turns
            assert [r["done"] for r in turns] == [False] * (len(turns) - 1) + [True]
            assert all(r["policy_version"] == step - 1 for r in turns)
            # The framework's own conversation reached the policy.
            assert turns[0]["prompt"][0]["role"] == "system"
            assert turns[0]["prompt"][0]["content"].startswith(system_prompt)
        rollouts.extend(by_rollout.values())
    return rollouts


@pytest.mark.slow
@needs_smolagents
def test_a_smolagents_tool_calling_agent_trains_two_steps(tmp_path: Path) -> None:
    check_smolagents_tool_calling_run(_train(tmp_path, f"{AGENTS / 'calc_smolagents.py'}:run"))


def check_smolagents_tool_calling_run(run: Path) -> None:
    """What a 2-step run of examples/agents/calc_smolagents.py shows."""
    # max_steps=2 tool-calling steps, then smolagents' own final-answer call.
    rollouts = _check_run(run, "Solve the arithmetic problem. Call the calculator", max_turns=3)
    # smolagents' default tool_choice="required": every tool-calling step was forced, the
    # forced "<call>" the last prompt ids (never a response id); the final-answer call
    # sends no tools and is not forced.
    for turns in rollouts:
        tool_steps = [t for t in turns if not t["prompt"][0]["content"].startswith("An agent")]
        assert tool_steps and all(t["forced"] == "<call>" for t in tool_steps)
        assert all(t["prompt_ids"][-6:] == _ids("<call>") for t in tool_steps)
        assert all("forced" not in t for t in turns if t not in tool_steps)
    # The third call is smolagents' final-answer call ("the agent got stuck"), same rollout.
    three = [t for t in rollouts if len(t) == 3]
    assert three
    for turns in three:
        assert turns[2]["prompt"][0]["content"].startswith("An agent tried to answer")
        # The tool-calling loop extends its context on exact tokens; the final-answer
        # call rewrites the system prompt, so its context is rebuilt (and says so).
        first, second = turns[0], turns[1]
        sampled = first["prompt_ids"] + first["response_ids"]
        assert second["context_rebuilt"] is False
        assert second["prompt_ids"][: len(sampled)] == sampled
        assert turns[2]["context_rebuilt"] is True


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("langgraph") is None
    or importlib.util.find_spec("langchain_openai") is None,
    reason="needs the agents extra (langgraph, langchain-openai)",
)
def test_a_langgraph_agent_trains_two_steps(tmp_path: Path) -> None:
    check_langgraph_run(_train(tmp_path, f"{AGENTS / 'calc_langgraph.py'}:run"))


def check_langgraph_run(run: Path) -> None:
    """What a 2-step run of examples/agents/calc_langgraph.py shows."""
    # recursion_limit=8 graph steps: at most 4 model calls (each tool round is a step).
    _check_run(run, "Solve the arithmetic problem. Reply with the number only.", max_turns=4)


@pytest.mark.slow
@needs_smolagents
def test_a_smolagents_code_agent_trains_two_steps(tmp_path: Path) -> None:
    check_code_agent_run(_train(tmp_path, f"{AGENTS / 'calc_smolagents_code.py'}:run"))


def check_code_agent_run(run: Path) -> None:
    """What a 2-step run of examples/agents/calc_smolagents_code.py shows."""
    # max_steps=2 code steps, then smolagents' final-answer call.
    rollouts = _check_run(run, "Solve the arithmetic problem. Write Python", max_turns=3)
    # CodeAgent offers no tools to the model: nothing is forced or parsed as a call.
    assert all("forced" not in t and t["tool_call"] is False for r in rollouts for t in r)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("agents") is None, reason="needs the agents extra (openai-agents)"
)
def test_an_openai_agents_sdk_agent_trains_two_steps(tmp_path: Path) -> None:
    check_agents_sdk_run(_train(tmp_path, f"{AGENTS / 'calc_agents_sdk.py'}:run"))


def check_agents_sdk_run(run: Path) -> None:
    """What a 2-step run of examples/agents/calc_agents_sdk.py shows."""
    # Runner.run(max_turns=4): at most 4 model calls.
    _check_run(run, "Solve the arithmetic problem. Reply with the number only.", max_turns=4)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("autogen_agentchat") is None
    or importlib.util.find_spec("mcp_server_calculator") is None,
    reason="needs the agents extra (autogen-agentchat, autogen-ext, mcp-server-calculator)",
)
def test_the_autogen_calc_x_agent_trains_two_steps(tmp_path: Path) -> None:
    check_calc_x_run(_train(tmp_path, f"{AGENTS / 'calc_x' / 'agent.py'}:run"))


def check_calc_x_run(run: Path) -> None:
    """What a 2-step run of examples/agents/calc_x/agent.py shows."""
    # One tool round and the reflection call after it, at most.
    _check_run(run, "You are a helpful AI assistant.", max_turns=2)


def _code_agent_episode(code: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One CodeAgent episode (examples/agents/calc_smolagents_code.py) on "Compute 6*7."
    against a policy that always writes ``code`` in a code block; its result and records."""
    from serve_scripted import ScriptedPolicy, serving

    example = load_object(f"{AGENTS / 'calc_smolagents_code.py'}:run", "test")
    policy = ScriptedPolicy(
        build_tiny_policy(seed=0), lambda context: f"Thought: run it.\n<code>\n{code}\n</code>"
    )
    with serving(policy) as (gateway, server):
        llm = SimpleNamespace(
            base_url=server.base_url("code-1"), api_key=server.api_key, model="turnrl"
        )
        result = example({"question": "Compute 6*7.", "answer": 42}, llm)
        return result, gateway.views.rollout("code-1")["records"]


@needs_smolagents
def test_the_code_agent_runs_the_policy_s_code_and_its_interpreter_refuses_imports() -> None:
    result, records = _code_agent_episode('final_answer(calculator("6*7"))')
    assert result == {"reward": 1.0, "info": {"success": True}}  # the code ran the tool
    # One call, ended by the stop string "</code>" (kept in the record's sampled tokens).
    assert [r["response"] for r in records] == [
        'Thought: run it.\n<code>\nfinal_answer(calculator("6*7"))\n</code>'
    ]
    # Code that imports os is refused by smolagents' interpreter, not run: the agent sees
    # the error, never a result, and ends without an answer.
    result, records = _code_agent_episode("import os\nfinal_answer(os.getcwd())")
    assert result["reward"] == 0.0
    assert len(records) == 3  # two refused code steps, then the final-answer call
    seen = "".join(m["content"] for m in records[1]["prompt"])
    assert "Import of os is not allowed" in seen and os.getcwd() not in seen


@needs_smolagents
def test_the_code_agent_recipe_loads_its_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    from turnrl.train.agent.programs import make_program
    from turnrl.train.config import RunConfig, load_config
    from turnrl.train.validate import validate

    monkeypatch.chdir(AGENTS.parents[1])  # the recipe names its file from the repo root
    config = load_config(RunConfig, AGENTS / "calc_smolagents_code.toml", [])
    validate(config)
    assert config.agent.entrypoint == "examples/agents/calc_smolagents_code.py:run"
    assert (config.warm_start.steps, config.policy.model) == (0, "tiny")
    make_program(config.agent.entrypoint, None, config.agent.env)
