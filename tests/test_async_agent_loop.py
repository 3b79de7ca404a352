"""Partial rollouts in the agent loop (``train.max_staleness = 1`` with ``[agent]``, #37):
which configs run, the admission schedule (the next step's agents during the update,
never across an evaluation or a checkpoint), a rollout whose two calls straddle the
push (each turn sampled by its own version and trained), and a run stopped with agents
in flight that resumes."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import agent_fixtures
from test_agent_loop import agent_config, command_agent_args, read_jsonl
from turnrl.cli import main as turnrl_main
from turnrl.policy import HFPolicy
from turnrl.train.agent.asynchronous import AsyncAgentTrainer, agent_trainer
from turnrl.train.agent.loop import AgentTrainer
from turnrl.train.process_copy import ProcessCopy, ProcessCopyError
from turnrl.train.update.ppo import UpdateBatch
from turnrl.train.validate import ConfigError, validate

ASYNC = ("train.max_staleness=1", "train.tis_cap=2.0")


def steps_of(run: Path) -> list[dict[str, Any]]:
    return [row for row in read_jsonl(run / "metrics.jsonl") if row["step"] > 0]


def versions_by_rollout(run: Path, step: int) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for record in read_jsonl(run / "rollouts" / f"step-{step:06d}.jsonl"):
        out.setdefault(record["traj_id"], []).append(record["policy_version"])
    return out


def living_children() -> set[int]:
    """This thread's child processes that are not zombies (empty where /proc has no
    ``children`` file)."""
    children = Path(f"/proc/self/task/{threading.get_native_id()}/children")
    if not children.exists():
        return set()
    alive = set()
    for pid in children.read_text().split():
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if state != "Z":
            alive.add(int(pid))
    return alive


def agent_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("turnrl-agents-")]


def test_the_agent_loop_runs_one_step_ahead_and_no_further(tmp_path: Path) -> None:
    validate(agent_config(tmp_path, *ASYNC))
    with pytest.raises(ConfigError, match="the agent loop runs at most one step ahead"):
        validate(agent_config(tmp_path, "train.max_staleness=2"))
    # a vLLM server is the agent loop's served copy at K = 1 (a config error before):
    # tests/test_vllm_server.py runs it against a real server
    validate(
        agent_config(
            tmp_path, *ASYNC, "policy.backend=vllm-server", "policy.server_url=http://127.0.0.1:9"
        )
    )


def test_k0_is_the_synchronous_loop_and_k1_serves_a_copy(tmp_path: Path) -> None:
    for name in ("k0", "k1"):
        (tmp_path / name).mkdir()
    sync = agent_trainer(agent_config(tmp_path / "k0", "train.max_staleness=0"), quiet=True)
    try:
        assert type(sync) is AgentTrainer
    finally:
        sync.close()
    ahead = agent_trainer(agent_config(tmp_path / "k1", *ASYNC), quiet=True)
    try:
        assert type(ahead) is AsyncAgentTrainer
        ahead.setup(None)
        # the gateway samples from a copy in a process of its own, given the learner's
        # weights: the same seed gives the learner's own tokens (log-probs to rounding)
        assert isinstance(ahead.served, ProcessCopy) and ahead.served.pid != os.getpid()
        assert ahead.served.policy_version == 0
        contexts = [ahead.policy.encode_initial([{"role": "user", "content": f"{i}+{i}?"}])
                    for i in range(3)]  # fmt: skip
        options = {"max_new_tokens": 8, "temperature": 1.0, "seed": 5}
        copied = ahead.served.sample(contexts, **options)
        own = ahead.policy.sample(contexts, **options)
        assert [s.response_ids for s in copied] == [s.response_ids for s in own]
        for a, b in zip(copied, own, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    finally:
        ahead.close()


def test_the_schedule_admits_the_next_step_only_past_evaluations_and_checkpoints(
    tmp_path: Path,
) -> None:
    """4 steps, a checkpoint after step 2, the evaluation only at the end: the agents of
    steps 2 and 4 run during the updates of steps 1 and 3; step 3's start after step 2's
    checkpoint. Every rollout is trained (none refused or discarded), each turn at most
    one version behind the weights its update starts from."""
    config = agent_config(
        tmp_path,
        *ASYNC,
        "train.steps=4",
        "train.checkpoint_every=2",
        "train.eval_every=4",
        agent="two_calls_graded",
    )
    run = agent_trainer(config, quiet=True).run()
    rows = steps_of(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["agents_ahead"] for r in rows] == [0.0, 1.0, 0.0, 1.0]
    assert [r["policy_version"] for r in rows] == [1, 2, 3, 4]
    assert [r["episodes"] for r in rows] == [4, 4, 4, 4]
    assert all(r["agent_failures"] == 0 for r in rows)
    for row in rows:
        step = row["step"]
        seen = {v for vs in versions_by_rollout(run, step).values() for v in vs}
        if row["agents_ahead"]:
            assert seen <= {step - 2, step - 1} and 0 <= row["staleness_max"] <= 1
        else:
            assert seen == {step - 1} and row["staleness_max"] == 0
        assert "tis_corrected_frac" in row and row["seconds_push"] >= 0
    assert not agent_threads()


def test_a_rollout_across_the_push_samples_each_call_with_its_own_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 2's agents run during step 1's update: the update waits for their first
    calls, and the gate lets their second calls go only once the new weights are served.
    Each rollout of step 2 then holds a turn of version 0 and one of version 1; the
    recorded log-probs of each are those of the weights of its own version (the warm
    start; the learner after step 1), and the step trains all of them."""
    gate = agent_fixtures.PushGate("s2-")
    monkeypatch.setattr(agent_fixtures, "PUSH_GATE", gate)
    after_one: dict[str, torch.Tensor] = {}
    update, serve = AsyncAgentTrainer.update, AsyncAgentTrainer.update_and_serve

    def held_update(self: AsyncAgentTrainer, batch: UpdateBatch) -> dict[str, float]:
        if self.step == 1:  # the 4 rollouts of step 2 made their first call
            assert all(gate.first_calls.acquire(timeout=120) for _ in range(4))
        return update(self, batch)

    def serve_then_open(self: AsyncAgentTrainer, batch: UpdateBatch) -> dict[str, float]:
        losses = serve(self, batch)
        if self.step == 1:
            after_one.update({k: v.clone() for k, v in self.policy.state_dict().items()})
            gate.pushed.set()
        return losses

    monkeypatch.setattr(AsyncAgentTrainer, "update", held_update)
    monkeypatch.setattr(AsyncAgentTrainer, "update_and_serve", serve_then_open)
    config = agent_config(
        tmp_path,
        *ASYNC,
        "train.lr=0.05",
        "train.eval_every=2",
        "train.checkpoint_every=2",
        "agent.entrypoint=agent_fixtures:across_a_push",
        agent=None,
    )
    run = agent_trainer(config, quiet=True).run()
    by_rollout = versions_by_rollout(run, 2)
    assert len(by_rollout) == 4 and all(v == [0, 1] for v in by_rollout.values())
    row = steps_of(run)[1]
    assert row["agents_ahead"] == 1.0 and row["episodes"] == 4 and row["agent_failures"] == 0
    assert row["staleness_mean"] == 0.5 and row["staleness_max"] == 1.0
    assert row["env_steps"] == 16  # step 1's 8 calls and all 8 of step 2 trained
    assert row["mismatch_logp_abs_mean"] > 0  # the version-0 turns, corrected per turn
    warm = HFPolicy.from_pretrained(run / "warm_start")
    learner = HFPolicy.from_pretrained(run / "warm_start")
    learner.load_state_dict(after_one)
    records = read_jsonl(run / "rollouts" / "step-000002.jsonl")
    for version, behaviour in ((0, warm), (1, learner)):
        mine = [r for r in records if r["policy_version"] == version]
        contexts = [r["prompt_ids"] for r in mine]
        responses = [r["response_ids"] for r in mine]
        served, mask = behaviour.response_logprobs(contexts, responses, temperature=1.0)
        recorded = torch.zeros_like(served)
        for i, r in enumerate(mine):
            recorded[i, : len(r["logprobs"])] = torch.tensor(r["logprobs"])
        assert torch.allclose(served * mask, recorded * mask, atol=1e-4)
        if version == 1:  # and step 1's update changed them: not the warm start's
            old, _ = warm.response_logprobs(contexts, responses, temperature=1.0)
            assert not torch.allclose(old * mask, recorded * mask, atol=1e-3)


def test_a_run_stopped_with_agents_in_flight_leaves_none_and_resumes(tmp_path: Path) -> None:
    """Stopped after step 3, whose update started step 4's agents: closing ends them
    (no thread left), and ``--resume`` redoes steps 3 and 4 from the step-2
    checkpoint with the same schedule."""
    args = (*ASYNC, "train.steps=4", "train.checkpoint_every=2", "train.eval_every=4")
    config = agent_config(tmp_path, *args, agent="two_calls_graded")
    agent_trainer(config, quiet=True).run(stop_after=3)
    assert not agent_threads()
    run = agent_trainer(config, resume=True, quiet=True).run()
    rows = steps_of(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["agents_ahead"] for r in rows] == [0.0, 1.0, 0.0, 1.0]
    assert all(r["agent_failures"] == 0 for r in rows)
    assert not agent_threads()


def test_a_served_copy_killed_under_the_agents_stops_the_run_with_its_line_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The served copy's process killed just before step 2's agents call it: the run
    stops with the copy's one line (pid, exit code -9), not with the agents' failures,
    and ``--resume`` redoes step 2 from step 1's checkpoint: every step once, no
    failure."""
    args = (*ASYNC, "train.steps=3", "train.checkpoint_every=1", "train.eval_every=3")
    config = agent_config(tmp_path, *args, agent="two_calls_graded")
    run_agents = AsyncAgentTrainer.run_agents
    killed: list[int] = []

    def killing(self: AsyncAgentTrainer, runner: Any, jobs: Any, where: str) -> Any:
        if where == "step-000002":
            killed.append(self.served.pid)
            os.kill(self.served.pid, signal.SIGKILL)
            self.served._process.join(30)
        return run_agents(self, runner, jobs, where)

    monkeypatch.setattr(AsyncAgentTrainer, "run_agents", killing)
    with pytest.raises(ProcessCopyError) as stopped:
        agent_trainer(config, quiet=True).run()
    assert str(stopped.value) == (
        f"the served copy's process (pid {killed[0]}) ended with exit code -9 while "
        "sampling; the run stopped (continue it with --resume)"
    )
    assert [r["step"] for r in steps_of(tmp_path / "run")] == [1]
    assert not agent_threads()
    monkeypatch.undo()
    run = agent_trainer(config, resume=True, quiet=True).run()
    rows = steps_of(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["agent_failures"] == 0 for r in rows)


def test_command_agents_run_ahead_through_the_cli_and_leave_no_process(tmp_path: Path) -> None:
    """Command agents started from the background thread of the agents run ahead:
    ``turnrl train`` picks the asynchronous loop, every rollout of the 3 steps trains,
    and no process of theirs is left."""
    before = living_children()
    overrides = (*ASYNC, "train.steps=3", "train.eval_every=3", "train.checkpoint_every=3")
    code = turnrl_main(command_agent_args(tmp_path, *overrides))
    assert code == 0
    rows = steps_of(tmp_path / "run")
    assert [r["agents_ahead"] for r in rows] == [0.0, 1.0, 1.0]
    assert [r["episodes"] for r in rows] == [4, 4, 4]
    assert not agent_threads()
    deadline = time.monotonic() + 10  # a killed agent is reaped by asyncio's watcher thread
    while living_children() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert living_children() - before == set()
