"""Warm start for any agent: the agent runs unchanged against a scripted teacher.

The teacher's replies go through the real gateway (tool descriptions, exact
contexts, tool calls handed back), so the demonstrations are the exact tokens the
policy sees under RL. Third-party agent frameworks (openai-agents, autogen with
the MCP calculator) run unchanged; they need the ``agents`` extra.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.records import record_to_json
from turnrl.serve import GatewayConfig, GatewayServer
from turnrl.train.agent.contract import AgentConfigError
from turnrl.train.agent.programs import make_program
from turnrl.train.agent.runner import AgentRunner, GatewayLink, RolloutResult
from turnrl.train.agent.tasks import calculator_task_set
from turnrl.train.agent.teacher import TeacherGateway, load_teacher, teacher_examples
from turnrl.train.update.sft import encode_response
from turnrl.types import Task

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ROOT / "examples" / "agents"
TEACHER = f"{AGENTS / 'calc_teacher.py'}:teach"


def json_records(result) -> list[dict]:
    """A rollout's turn records as the JSON lines they are written as."""
    return [record_to_json(r) for r in result.records]


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    return build_tiny_policy(0)


def tasks(n: int = 6) -> list[Task]:
    return calculator_task_set(n, seed=0)


def run_with_teacher(
    policy: HFPolicy, agent: str, teacher: str, tasks: list[Task], **config: Any
) -> tuple[list[RolloutResult], Any]:
    jobs = [(f"w-{i}", task) for i, task in enumerate(tasks)]
    by_rollout = {rid: dict(task.payload) for rid, task in jobs}
    gateway_config = GatewayConfig(default_max_tokens=24, **config)
    with (
        TeacherGateway(policy, load_teacher(teacher), by_rollout, gateway_config) as gateway,
        GatewayServer(gateway) as server,
    ):
        runner = AgentRunner(
            make_program(agent, None),
            GatewayLink(gateway, server),
            concurrency=4,
            timeout_s=120,
            model="agent",
        )
        return runner.run(jobs), gateway


def calc_teacher() -> Any:
    spec = importlib.util.spec_from_file_location("calc_teacher", AGENTS / "calc_teacher.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def uses_tool(task: Task) -> bool:
    return bool(calc_teacher().uses_tool(dict(task.payload)))


def test_the_worked_teacher_writes_direct_answers_out_and_a_tool_result_as_the_number() -> None:
    teacher = calc_teacher()
    tools = [{"function": {"name": "calculator", "parameters": {"required": ["expression"]}}}]
    direct = {"task_id": "calc-9-4", "expression": "9-4", "answer": 5, "demo": {"use_tool": False}}
    called = {**direct, "demo": {"use_tool": True}}
    hard = {"task_id": "calc-970*494", "expression": "970*494", "answer": 479180, "tags": []}
    ask = [{"role": "user", "content": "Compute 9-4."}]
    assert teacher.teach_worked(ask, tools, direct) == {"role": "assistant", "content": "9 - 4 = 5"}
    assert teacher.teach_worked(ask, [], hard)["content"] == "970 * 494 = 479180"
    call = teacher.teach_worked(ask, tools, called)
    assert call["tool_calls"][0]["function"]["arguments"] == '{"expression": "9-4"}'
    after = [*ask, call, {"role": "tool", "content": "5"}]
    assert teacher.teach_worked(after, tools, called) == {"role": "assistant", "content": "5"}


def test_the_openai_agent_against_the_teacher_records_exact_demonstrations(
    policy: HFPolicy,
) -> None:
    chosen = tasks(8)
    results, _ = run_with_teacher(policy, f"{AGENTS / 'calc_openai.py'}:run", TEACHER, chosen)
    assert [r.failure for r in results] == [None] * len(chosen)
    assert [r.reward for r in results] == [1.0] * len(chosen)
    with_tool = [uses_tool(t) for t in chosen]
    assert any(with_tool) and not all(with_tool)  # the sample has both kinds
    for result, tool in zip(results, with_tool, strict=True):
        task = result.task.payload
        records = json_records(result)
        assert [r["role"] for r in records] == ["agent"] * len(records)
        assert [r["tool_call"] for r in records] == ([True, False] if tool else [False])
        # The agent's own prompt, with the tool described by the gateway.
        assert records[0]["prompt"][0]["content"].startswith("Solve the arithmetic problem.")
        assert (
            "<call>EXPRESSION</call> calculator: evaluates arithmetic"
            in (records[0]["prompt"][0]["content"])
        )
        assert records[0]["prompt"][1] == {"role": "user", "content": task["question"]}
        expected = [f"<call>{task['expression']}</call>", str(task["answer"])]
        assert [r["response"] for r in records] == (expected if tool else expected[1:])
        for record in records:
            assert record["response_ids"] == encode_response(policy, record["response"])
            assert record["context_rebuilt"] is False
        if tool:  # the second turn extends the first with the tool result only
            first, second = records
            head = first["prompt_ids"] + first["response_ids"]
            assert second["prompt_ids"][: len(head)] == head
            assert second["prompt"][-1] == {"role": "tool", "content": str(task["answer"])}
    examples = teacher_examples([r for res in results for r in res.records])
    assert len(examples) == sum(1 + t for t in with_tool)
    assert examples[0].context == json_records(results[0])[0]["prompt_ids"]


def test_two_roles_are_recorded_as_roles(policy: HFPolicy) -> None:
    agent = f"{AGENTS / 'solver_checker.py'}"
    hard = [t for t in tasks(12) if "hard" in t.tags][:2]
    easy = [t for t in tasks(12) if "easy" in t.tags][:1]
    results, _ = run_with_teacher(policy, f"{agent}:run", f"{agent}:teach", hard + easy)
    assert [r.reward for r in results] == [1.0, 1.0, 1.0]
    for result in results[:2]:  # guess, rejected, tool call, answer
        roles = [r["role"] for r in json_records(result)]
        assert roles == ["solver", "checker", "solver", "solver"]
        assert [r["response"] for r in json_records(result)][1] == "no"
        assert [r["turn"] for r in json_records(result)] == [0, 1, 2, 3]
    assert [r["role"] for r in json_records(results[2])] == ["solver", "checker"]
    assert json_records(results[2])[1]["response"] == "yes"


def test_a_broken_teacher_fails_the_rollout_with_its_message(
    policy: HFPolicy, tmp_path: Path
) -> None:
    teacher = tmp_path / "bad_teacher.py"
    teacher.write_text(
        "def teach(messages, tools, task):\n    return {'role': 'user', 'content': 'x'}\n"
    )
    results, _ = run_with_teacher(
        policy, f"{AGENTS / 'calc_openai.py'}:run", f"{teacher}:teach", tasks(1)
    )
    assert results[0].failure is not None
    assert "warm_start.teacher must return an assistant message" in results[0].failure.reason
    with pytest.raises(AgentConfigError, match="must accept 3 positional arguments"):
        load_teacher(f"{AGENTS / 'calc_openai.py'}:run")


@pytest.mark.skipif(
    importlib.util.find_spec("agents") is None, reason="needs the agents extra (openai-agents)"
)
def test_an_openai_agents_sdk_agent_runs_unchanged(policy: HFPolicy) -> None:
    chosen = tasks(4)
    results, _ = run_with_teacher(policy, f"{AGENTS / 'calc_agents_sdk.py'}:run", TEACHER, chosen)
    assert [r.reward for r in results] == [1.0] * 4
    for result, task in zip(results, chosen, strict=True):
        tool = uses_tool(task)
        assert [r["tool_call"] for r in json_records(result)] == (
            [True, False] if tool else [False]
        )
        assert json_records(result)[0]["prompt"][0]["content"].startswith("Solve the arithmetic")


@pytest.mark.skipif(
    importlib.util.find_spec("autogen_agentchat") is None
    or importlib.util.find_spec("mcp_server_calculator") is None,
    reason="needs the agents extra (autogen-agentchat, autogen-ext, mcp-server-calculator)",
)
def test_the_autogen_calc_x_agent_with_the_mcp_calculator(policy: HFPolicy) -> None:
    chosen = [t for t in tasks(12) if uses_tool(t)][:1] + [
        t for t in tasks(12) if "easy" in t.tags
    ][:1]
    results, _ = run_with_teacher(
        policy,
        f"{AGENTS / 'calc_x' / 'agent.py'}:run",
        f"{AGENTS / 'calc_teacher.py'}:teach_calc_x",
        chosen,
    )
    assert [r.reward for r in results] == [1.0, 1.0]
    tool_run, direct = results
    # Tool call (the MCP server computes it), then autogen's reflection call without tools.
    answer = str(chosen[0].payload["answer"])
    assert [r["response"] for r in json_records(tool_run)] == [
        f"<call>{chosen[0].payload['expression']}</call>",
        f"### ANSWER: {answer} ###",
    ]
    assert json_records(tool_run)[1]["prompt"][-1] == {"role": "tool", "content": answer}
    assert (
        "calculate: Calculates/evaluates the given expression."
        in (json_records(tool_run)[0]["prompt"][0]["content"])
    )
    assert json_records(tool_run)[1]["context_rebuilt"] is False
    assert [r["tool_call"] for r in json_records(direct)] == [False]
