"""Agent frameworks a new user brings, trained unchanged through ``turnrl train``.

A smolagents ``ToolCallingAgent`` over LiteLLM (it sends ``stop`` on every call)
and a LangGraph tool-calling graph over ``ChatOpenAI``, from examples/agents/,
each trained for 2 steps on the tiny model with calculator tasks. An agent whose
call the gateway refused would fail its episode, and the run would stop; so a
finished run with no failed episode shows every call was served.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from turnrl.cli import main as turnrl_main
from turnrl.table import TurnTable

torch.set_num_threads(1)

AGENTS = Path(__file__).resolve().parents[1] / "examples" / "agents"

TWO_STEPS = (
    "tasks.train=calculator",
    "tasks.n_train=8",
    "tasks.n_eval=2",
    "warm_start.steps=0",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "policy.max_new_tokens=8",
    "train.steps=2",
    "train.eval_every=2",
    "train.checkpoint_every=1",
    "train.minibatch_size=4",
    "train.threads=1",
    "agent.concurrency=4",
    "agent.timeout_s=120",
)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _train(tmp_path: Path, entrypoint: str) -> Path:
    run = tmp_path / "run"
    code = turnrl_main(
        ["train", "--quiet", "--run-dir", str(run), f"agent.entrypoint={entrypoint}", *TWO_STEPS]
    )
    assert code == 0
    return run


def _check_run(run: Path, system_prompt: str, max_turns: int) -> list[list[dict[str, Any]]]:
    """Two updates from this agent's own calls; the rollouts of both steps."""
    metrics = _jsonl(run / "metrics.jsonl")
    trained = [m for m in metrics if m["step"] > 0]
    assert [m["step"] for m in trained] == [1, 2]
    assert [m["policy_version"] for m in trained] == [1, 2]
    assert [m["episodes"] for m in trained] == [4, 4]
    assert [m["agent_failures"] for m in trained] == [0, 0]
    assert not (run / "agent_failures.jsonl").exists()
    rollouts = []
    for step in (1, 2):
        records = _jsonl(run / "rollouts" / f"step-{step:06d}.jsonl")
        TurnTable.from_records(records)  # valid turn records
        by_rollout: dict[str, list[dict[str, Any]]] = {}
        for record in records:
            by_rollout.setdefault(record["traj_id"], []).append(record)
        assert len(by_rollout) == 4
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


@pytest.mark.skipif(
    importlib.util.find_spec("smolagents") is None or importlib.util.find_spec("litellm") is None,
    reason="needs the agents extra (smolagents, litellm)",
)
def test_a_smolagents_tool_calling_agent_over_litellm_trains_two_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import
    run = _train(tmp_path, f"{AGENTS / 'calc_smolagents.py'}:run")
    # max_steps=2 tool-calling steps, then smolagents' own final-answer call.
    rollouts = _check_run(run, "Solve the arithmetic problem. Call the calculator", max_turns=3)
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


@pytest.mark.skipif(
    importlib.util.find_spec("langgraph") is None
    or importlib.util.find_spec("langchain_openai") is None,
    reason="needs the agents extra (langgraph, langchain-openai)",
)
def test_a_langgraph_agent_trains_two_steps(tmp_path: Path) -> None:
    run = _train(tmp_path, f"{AGENTS / 'calc_langgraph.py'}:run")
    # recursion_limit=8 graph steps: at most 4 model calls (each tool round is a step).
    _check_run(run, "Solve the arithmetic problem. Reply with the number only.", max_turns=4)
