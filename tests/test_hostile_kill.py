"""SIGKILL of ``turnrl train`` (what the OOM killer sends) (issue 38).

* A resumed run used to log the failures of the steps it redoes twice in
  ``agent_failures.jsonl``: now the log is cut back to the steps the checkpoint keeps.
* Command agents and their children used to outlive a killed trainer (PPID 1): now
  they die with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from test_hostile_run import (
    agent_args,
    command,
    entry,
    marker,
    marker_processes,
    read_jsonl,
    subprocess_env,
    wait_until,
)
from turnrl.cli import main as turnrl_main
from turnrl.train.agent.loop import keep_failures_of_done_steps
from turnrl.train.checkpoint import list_checkpoints


def test_keeping_the_failures_of_done_steps(tmp_path: Path) -> None:
    log = tmp_path / "agent_failures.jsonl"
    steps = ("warm_start", "eval-000000", "step-000001", "eval-000001", "step-000002")
    rows = [{"at": at, "rollout_id": at} for at in steps]
    text = "".join(json.dumps(row) + "\n" for row in rows)
    log.write_text(text + '{"at": "step-0000')  # a line cut by the kill
    keep_failures_of_done_steps(log, 1)
    assert [row["at"] for row in read_jsonl(log)] == [
        "warm_start",
        "eval-000000",
        "step-000001",
        "eval-000001",
    ]
    log.write_text(text)
    keep_failures_of_done_steps(log, 0)
    assert log.read_text() == ""
    keep_failures_of_done_steps(tmp_path / "absent.jsonl", 3)
    assert not (tmp_path / "absent.jsonl").exists()


def test_resume_after_a_sigkill_before_the_first_checkpoint_logs_each_failure_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    args = agent_args(
        tmp_path,
        f"agent.entrypoint={entry('exits_on_odd')}",
        "agent.max_failure_fraction=0.5",
        "train.steps=2",
        "train.checkpoint_every=2",
        "train.eval_every=2",
    )
    env = subprocess_env()
    trainer = subprocess.Popen(
        [sys.executable, "-m", "turnrl.cli", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    log = run_dir / "agent_failures.jsonl"
    try:
        wait_until(
            lambda: (
                trainer.poll() is not None or (log.exists() and "step-000001" in log.read_text())
            ),
            what="step 1's failures",
        )
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=60)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    assert trainer.returncode == -signal.SIGKILL
    assert list_checkpoints(run_dir) == []
    assert "step-000001" in log.read_text()
    assert turnrl_main([*args, "--resume"]) == 0, capsys.readouterr().err  # in this process
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    failures = read_jsonl(log)
    counts = Counter((f["at"], f["rollout_id"]) for f in failures)
    assert max(counts.values()) == 1, counts
    steps = [f for f in failures if f["at"].startswith("step-")]
    assert len(steps) == sum(m["agent_failures"] for m in metrics[1:]) == 4  # 2 of 4 a step


__all__ = ["marker"]  # the fixture, imported from test_hostile_run


def test_sigkill_of_the_trainer_kills_every_command_agent_and_its_children(
    tmp_path: Path, marker: str
) -> None:
    """Hanging command agents, each with a child in its group and one that left it
    (setsid): SIGKILL the trainer; every one of them is gone soon after (a bounded
    wait), none re-parented to init."""
    flag = tmp_path / "hang"
    flag.touch()
    args = agent_args(tmp_path, "agent.command=" + json.dumps(command("spawns_and_hangs")))
    trainer = subprocess.Popen(
        [sys.executable, "-m", "turnrl.cli", *args],
        env=subprocess_env(HOSTILE_FLAG=str(flag)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids = tmp_path / "pids"
    try:
        wait_until(
            lambda: (
                trainer.poll() is not None or (pids.exists() and len(pids.read_text().split()) >= 4)
            ),
            what="hanging agents with children",
        )
        assert trainer.poll() is None
        assert len(marker_processes(marker)) >= 6  # 2+ agents, each with 2 children
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=60)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    try:
        wait_until(lambda: marker_processes(marker) == [], timeout=30, what="no agent left")
    finally:
        for pid in marker_processes(marker):  # a failed test leaves nothing running
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert marker_processes(marker) == []
