"""The agent runner: user programs (entrypoints and commands) against the real gateway.

Every agent here is in ``tests/agent_fixtures.py``; the policy is the tiny random
model behind an in-process gateway on a free loopback port. Bad agents (raises,
hangs, no reward, NaN, non-zero exit, no call) must be dropped with their reason
and details saved, and leave no process behind.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_fixtures import parity
from serve_scripted import serving
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.records import record_to_json
from turnrl.serve import Gateway, GatewayError, GatewayServer
from turnrl.train.agent.contract import (
    AgentConfigError,
    AgentFailed,
    AgentOutput,
    load_entrypoint,
    reward_of,
)
from turnrl.train.agent.programs import make_program
from turnrl.train.agent.runner import (
    AgentFailure,
    AgentRunner,
    GatewayLink,
    failure_fraction_error,
)
from turnrl.types import Task

FIXTURES = Path(__file__).with_name("agent_fixtures.py")


def json_records(result) -> list[dict]:
    """A rollout's turn records as the JSON lines they are written as."""
    return [record_to_json(r) for r in result.records]


def entry(name: str) -> str:
    return f"{FIXTURES}:{name}"


def command(name: str) -> list[str]:
    return ["python", str(FIXTURES), name]


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    return build_tiny_policy(0)


@pytest.fixture
def served(policy: HFPolicy) -> Iterator[tuple[Gateway, GatewayServer]]:
    with serving(policy, default_max_tokens=8, batch_window_s=0.001) as pair:
        yield pair


def tasks(n: int) -> list[Task]:
    return [Task(f"t-{i}", {"task_id": f"t-{i}", "question": f"Q{i}?"}) for i in range(n)]


def run(
    served: tuple[Gateway, GatewayServer],
    program: Any,
    n: int = 2,
    *,
    timeout_s: float = 60.0,
    failure_dir: Path | None = None,
) -> list[Any]:
    gateway, server = served
    runner = AgentRunner(
        program, GatewayLink(gateway, server), concurrency=4, timeout_s=timeout_s, model="m"
    )
    return runner.run([(f"r{i}", t) for i, t in enumerate(tasks(n))], failure_dir=failure_dir)


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("mode", ["entrypoint", "command"])
def test_records_are_what_the_agent_sent_and_got(
    served: tuple[Gateway, GatewayServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("TURNRL_TEST_LOG", str(log))
    program = (
        make_program(entry("two_calls"), None)
        if mode == "entrypoint"
        else make_program(None, command("good"))
    )
    results = run(served, program, n=3)
    calls = read_log(log)
    assert [r.failure for r in results] == [None, None, None]
    per_rollout = 2 if mode == "entrypoint" else 1
    assert len(calls) == 3 * per_rollout
    for result in results:
        sent = [c for c in calls if c["rollout"] == result.rollout_id]
        assert len(json_records(result)) == per_rollout
        for turn, (record, call) in enumerate(zip(json_records(result), sent, strict=True)):
            assert record["turn"] == turn
            assert record["traj_id"] == result.rollout_id
            assert record["prompt"] == call["sent"]
            assert record["response"] == call["got"]
        assert json_records(result)[-1]["done"] is True
        assert json_records(result)[-1]["reward"] == result.reward == parity(sent[-1]["got"])
    if mode == "entrypoint":
        # The second call extends the first: its context starts with the first's tokens.
        first, second = json_records(results[0])
        assert second["prompt_ids"][: len(first["prompt_ids"])] == first["prompt_ids"]
        assert second["context_rebuilt"] is False


@pytest.mark.parametrize(
    "program", [(entry("posts_reward"), None), (None, command("posts"))], ids=["entry", "command"]
)
def test_a_posted_reward_finishes_the_rollout(
    served: tuple[Gateway, GatewayServer], program: tuple[Any, Any]
) -> None:
    results = run(served, make_program(*program), n=2)
    expected = 0.25 if program[0] else 0.75
    assert [(r.failure, r.reward) for r in results] == [(None, expected)] * 2
    assert [json_records(r)[-1]["reward"] for r in results] == [expected] * 2


BAD_AGENTS = [
    ((entry("raises"), None), "raised ValueError: boom on t-0", "raise ValueError"),
    ((entry("hangs"), None), "timed out after 1 s", "time.sleep(3600)"),
    ((entry("async_hangs"), None), "timed out after 1 s", "asyncio.sleep(3600)"),
    ((entry("no_reward"), None), "no reward (nothing returned or printed, nothing posted)", ""),
    ((entry("nan_reward"), None), "the reward is not finite (nan)", ""),
    ((entry("no_call"), None), "the agent made no call to the model", ""),
    (
        (None, command("exits")),
        "exited with code 3: something went wrong in the agent",
        "something went wrong in the agent",
    ),
    ((None, command("silent")), "no reward (nothing returned or printed, nothing posted)", ""),
    ((None, command("nan")), "the reward is not finite (nan)", ""),
]


@pytest.mark.parametrize(
    ("program", "reason", "detail"),
    BAD_AGENTS,
    ids=[
        "raises",
        "hangs",
        "async-hangs",
        "no-reward",
        "nan",
        "no-call",
        "exits",
        "cmd-no-reward",
        "cmd-nan",
    ],
)
def test_bad_agents_are_dropped_with_details_saved(
    served: tuple[Gateway, GatewayServer],
    tmp_path: Path,
    program: tuple[Any, Any],
    reason: str,
    detail: str,
) -> None:
    gateway, _ = served
    timeout_s = 1.0 if "timed out" in reason else 60.0
    results = run(served, make_program(*program), n=1, timeout_s=timeout_s, failure_dir=tmp_path)
    (result,) = results
    assert result.records == []
    assert result.failure is not None
    assert result.failure.reason == reason
    assert result.failure.rollout_id == "r0"
    assert result.failure.path == str(tmp_path / "r0.txt")
    saved = Path(result.failure.path).read_text()
    assert f"failure: {reason}" in saved
    assert detail in saved
    # The failed rollout is closed: a late call on it is refused.
    with pytest.raises(GatewayError) as refused:
        gateway.views.rollout("r0")
    assert refused.value.status == 409


def _gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs (absent, or a zombie awaiting its reaper)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def test_a_hung_command_and_its_children_are_killed(
    served: tuple[Gateway, GatewayServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = tmp_path / "pids"
    monkeypatch.setenv("TURNRL_TEST_PIDS", str(pids))
    started = time.monotonic()
    # As the trainer's user: the pids the command writes are the machine's (in its own
    # PID namespace, the default here, they would be 1 and 2 there; that the default
    # kills every process it started is test_hostile_run's, by argv).
    program = make_program(None, command("hangs"), isolation="none")
    (result,) = run(served, program, n=1, timeout_s=5.0, failure_dir=tmp_path)
    assert time.monotonic() - started < 30
    assert result.failure is not None
    assert result.failure.reason == "timed out after 5 s (killed)"
    assert "about to hang" in Path(result.failure.path or "").read_text()
    parent, child = (int(p) for p in pids.read_text().split())
    deadline = time.monotonic() + 10
    while not (_gone(parent) and _gone(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(parent) and _gone(child)


def test_bad_entrypoints_and_commands_fail_before_any_run() -> None:
    cases = {
        "no colon": "agent.entrypoint: expected 'package.module:function'",
        "no_such_module_xyz:run": "agent.entrypoint: cannot import 'no_such_module_xyz'",
        f"{FIXTURES}:missing": "has no attribute 'missing'",
        f"{FIXTURES}:QUESTION_PROMPT": "is not callable",
        f"{FIXTURES}:wrong_signature": "must accept (task, llm)",
        "examples/no_such_file.py:run": "agent.entrypoint: no such file 'examples/no_such_file.py'",
    }
    for spec, message in cases.items():
        with pytest.raises(AgentConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_entrypoint(spec)
    with pytest.raises(AgentConfigError, match="program 'no-such-program-xyz' not found"):
        make_program(None, ["no-such-program-xyz"])
    with pytest.raises(AgentConfigError, match="exactly one of"):
        make_program(entry("two_calls"), ["python"])
    with pytest.raises(AgentConfigError, match="exactly one of"):
        make_program(None, None)


def test_reward_of_rules() -> None:
    assert reward_of(AgentOutput(value=1), None) == (1.0, {})
    assert reward_of(AgentOutput(value={"reward": 0.5, "info": {"a": 1}}), None) == (0.5, {"a": 1})
    assert reward_of(AgentOutput(value=None), 2.0) == (2.0, {})
    assert reward_of(AgentOutput(value={"info": {"b": 2}}), 2.0) == (2.0, {"b": 2})
    for bad, message in [
        (True, "must be a number"),
        ("1", "must be a number"),
        (float("inf"), "not finite"),
        ({"info": {}}, "without 'reward'"),
        ({"reward": 1, "info": 3}, "'info' must be a dict"),
    ]:
        with pytest.raises(AgentFailed, match=message):
            reward_of(AgentOutput(value=bad), None)


def test_failure_fraction_names_the_first_failure() -> None:
    failures = [
        AgentFailure("s1-r1", "t-1", "raised RuntimeError: odd task", "runs/x/f/s1-r1.txt"),
        AgentFailure("s1-r3", "t-3", "raised RuntimeError: odd task", None),
    ]
    assert failure_fraction_error(failures, 8, 0.25, "step 1") is None
    message = failure_fraction_error(failures, 7, 0.25, "step 1")
    assert message == (
        "2 of 7 agent rollouts failed in step 1, more than agent.max_failure_fraction=0.25; "
        "first failure: rollout s1-r1 (task t-1): raised RuntimeError: odd task "
        "(details: runs/x/f/s1-r1.txt)"
    )


def test_no_agent_thread_or_child_outlives_a_good_run(
    served: tuple[Gateway, GatewayServer],
) -> None:
    import threading

    before = {t.ident for t in threading.enumerate()}
    results = run(served, make_program(None, command("good")), n=2)
    assert all(r.failure is None for r in results)
    leftover = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert [t.name for t in leftover if t.name == "turnrl-agent"] == []
    children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    if children.exists():
        alive = [int(p) for p in children.read_text().split() if not _gone(int(p))]
        assert alive == []
