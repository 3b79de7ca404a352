"""An agent cannot break a run (issue 21, the run side).

Each test runs a misbehaving agent from ``tests/hostile_agents.py`` (or injects a
fault: a full disk, a signal, a second process) and asserts the exit code, the
message, what is kept on disk, and that no process is left behind.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from serve_scripted import serving
from turnrl.cli import main as turnrl_main
from turnrl.credit import compute_credit
from turnrl.errors import OutputError
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.serve import Gateway, GatewayServer
from turnrl.table import TurnTable
from turnrl.train.agent.command import OUTPUT_TAIL_BYTES, TASK_ENV_MAX_BYTES
from turnrl.train.agent.contract import AgentConfigError
from turnrl.train.agent.programs import make_program
from turnrl.train.agent.runner import AgentRunner, GatewayLink
from turnrl.train.checkpoint import list_checkpoints
from turnrl.train.config import RunConfig, load_config
from turnrl.train.process_tree import descendants, is_subreaper
from turnrl.train.run import RunDirectory
from turnrl.train.run_lock import LOCK_FILE, RunLockedError
from turnrl.train.update.credit_check import (
    MAX_ABS_REWARD,
    CreditOverflowError,
    check_finite_credit,
)
from turnrl.train.update.ppo import build_update_batch
from turnrl.types import Task, TurnRecord

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
HOSTILE = TESTS / "hostile_agents.py"

TINY_AGENT = (
    "warm_start.steps=0",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "policy.max_new_tokens=4",
    "train.steps=2",
    "train.eval_every=1",
    "train.checkpoint_every=1",
    "train.minibatch_size=4",
    "train.threads=1",
    "agent.concurrency=4",
    "agent.timeout_s=60",
    "agent.port=0",
    "logging.report=false",  # the report: test_plain_logs, test_report
)


# ----------------------------------------------------------------------------- helpers


def entry(name: str) -> str:
    return f"{HOSTILE}:{name}"


def command(name: str) -> list[str]:
    return ["python", str(HOSTILE), name]


def write_tasks(path: Path, n: int, prefix: str = "t") -> str:
    lines = [json.dumps({"task_id": f"{prefix}-{i}", "question": f"Q{i}?"}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def agent_args(tmp_path: Path, *overrides: str, run_dir: Path | None = None) -> list[str]:
    """``turnrl train`` arguments of a tiny agent-loop run (tasks written to tmp_path)."""
    train = write_tasks(tmp_path / "train.jsonl", 4)
    held_out = write_tasks(tmp_path / "eval.jsonl", 2, prefix="e")
    return [
        "train",
        "--quiet",
        "--run-dir",
        str(run_dir or tmp_path / "run"),
        f"tasks.train={train}",
        f"tasks.eval={held_out}",
        *TINY_AGENT,
        *overrides,
    ]


def marker_processes(marker: str) -> list[int]:
    """Living (non-zombie) processes with ``marker`` in their argv or environment."""
    found = []
    for entry_ in os.scandir("/proc"):
        if not entry_.name.isdigit():
            continue
        try:
            text = (
                Path(entry_.path, "cmdline").read_bytes()
                + Path(entry_.path, "environ").read_bytes()
            )
            state = Path(entry_.path, "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if marker.encode() in text and state != "Z":
            found.append(int(entry_.name))
    return found


def wait_until(condition: Any, timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "src"), str(TESTS), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def communicate_or_dump(process: subprocess.Popen[str], timeout: float) -> str:
    """Wait for ``process`` (started with ``PYTHONFAULTHANDLER=1``) and return its
    stderr; past ``timeout`` send it SIGABRT, so that faulthandler prints every thread's
    stack, and fail with that dump (where it waited is then in the test report)."""
    try:
        return process.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        try:
            _, err = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            err = "(no dump within 30 s of SIGABRT)"
        raise AssertionError(
            f"pid {process.pid} still running {timeout:g} s later; its stacks:\n{err[-20000:]}"
        ) from None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    return build_tiny_policy(0)


@pytest.fixture
def served(policy: HFPolicy) -> Iterator[tuple[Gateway, GatewayServer]]:
    with serving(policy, default_max_tokens=4, batch_window_s=0.001) as pair:
        yield pair


@pytest.fixture
def marker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A unique word in every process a hostile agent spawns (and where it logs pids)."""
    word = f"hostile-{uuid.uuid4().hex}"
    monkeypatch.setenv("HOSTILE_MARKER", word)
    monkeypatch.setenv("HOSTILE_PIDS", str(tmp_path / "pids"))
    return word


def run_batch(
    served: tuple[Gateway, GatewayServer],
    program: Any,
    tasks: list[Task],
    *,
    timeout_s: float = 60.0,
    failure_dir: Path | None = None,
) -> list[Any]:
    gateway, server = served
    runner = AgentRunner(
        program, GatewayLink(gateway, server), concurrency=4, timeout_s=timeout_s, model="m"
    )
    return runner.run([(f"r{i}", t) for i, t in enumerate(tasks)], failure_dir=failure_dir)


def tasks(n: int) -> list[Task]:
    return [Task(f"t-{i}", {"task_id": f"t-{i}", "question": f"Q{i}?"}) for i in range(n)]


# ------------------------------------------------- 1. anything an agent raises is its failure


@pytest.mark.parametrize(
    ("agent", "reason"),
    [
        ("exits_0", "raised SystemExit: 0"),
        ("exits_3", "raised SystemExit: 3"),
        ("keyboard_interrupt", "raised KeyboardInterrupt: "),
        ("raises_cancelled", "raised CancelledError: "),
        ("async_exits_0", "raised SystemExit: 0"),
        ("async_exits_3", "raised SystemExit: 3"),
        ("async_keyboard_interrupt", "raised KeyboardInterrupt: "),
    ],
)
def test_a_base_exception_from_an_agent_fails_only_its_rollout(
    served: tuple[Gateway, GatewayServer], tmp_path: Path, agent: str, reason: str
) -> None:
    before = descendants()
    results = run_batch(served, make_program(entry(agent), None), tasks(2), failure_dir=tmp_path)
    assert [r.failure.reason for r in results] == [reason, reason]
    assert [r.records for r in results] == [[], []]
    saved = (tmp_path / "r0.txt").read_text()
    assert f"failure: {reason}" in saved
    assert "Traceback" in saved  # the traceback is kept
    assert descendants() == before


def test_agents_exiting_or_interrupting_are_counted_and_the_run_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sys.exit(0)`` from a sync agent and ``KeyboardInterrupt`` from an async one on
    half the tasks: the run finishes (exit code 0) with every failure logged."""
    before = descendants()
    for agent, run in (("exits_on_odd", "sync"), ("async_interrupts_on_odd", "async")):
        run_dir = tmp_path / run
        code = turnrl_main(
            agent_args(
                tmp_path,
                f"agent.entrypoint={entry(agent)}",
                "agent.max_failure_fraction=0.5",
                "train.steps=1",
                run_dir=run_dir,
            )
        )
        assert code == 0, capsys.readouterr().err
        metrics = read_jsonl(run_dir / "metrics.jsonl")
        assert [m["step"] for m in metrics] == [0, 1]
        # Two odd tasks of four (each with group_size 2) per step: half the rollouts.
        failures = read_jsonl(run_dir / "agent_failures.jsonl")
        expected = "raised SystemExit: 0" if run == "sync" else "raised KeyboardInterrupt: "
        assert {f["reason"] for f in failures} == {expected}
        assert all(f["task_id"].rsplit("-", 1)[1] in "13" for f in failures)
        steps = [m for m in metrics if m["step"] > 0]
        assert sum(m["agent_failures"] for m in steps) == sum(
            f["at"].startswith("step-") for f in failures
        )
        assert [m["episodes"] + m["agent_failures"] for m in steps] == [4]
        for failure in failures:
            assert expected in Path(failure["path"]).read_text()
        assert list_checkpoints(run_dir)[-1][0] == 1
    assert descendants() == before
    assert not is_subreaper()  # as before the command


# ---------------------------------------------------------------- 2. one process per run dir


def hold_lock(run_dir: Path) -> subprocess.Popen[str]:
    """Another process holding ``run_dir``'s lock (until killed)."""
    script = (
        "import sys, time; from turnrl.train.run_lock import acquire; "
        f"acquire({str(run_dir)!r}); print('locked', flush=True); time.sleep(3600)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=subprocess_env()
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_locked_run_directory_is_refused_naming_the_holder(
    tmp_path: Path, tiny_train: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = hold_lock(run_dir)
    try:
        with pytest.raises(
            RunLockedError, match=f"in use by another turnrl process \\(pid {holder.pid}"
        ):
            RunDirectory.open(tiny_train(run_dir), resume=True)
        code = turnrl_main(
            [
                "iterate",
                "--config",
                str(REPO / "examples" / "iterate_haggle.toml"),
                "--run-dir",
                str(run_dir),
                "--resume",
            ]
        )
        err = error_lines(capsys.readouterr().err)
        assert code == 2
        assert len(err) == 1
        assert err[0].startswith(f"turnrl iterate: error: run_dir {run_dir} is in use")
        assert f"(pid {holder.pid}," in err[0]
        assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]  # nothing written
        # a second `turnrl train --resume` of an agent run likewise
        agent = "agent.command=" + json.dumps(command("big_task"))
        code = turnrl_main([*agent_args(tmp_path, agent, run_dir=run_dir), "--resume"])
        err = error_lines(capsys.readouterr().err)
        assert code == 2
        assert len(err) == 1, err
        assert err[0].startswith(
            f"turnrl train: error: run_dir {run_dir} is in use by another turnrl process "
            f"(pid {holder.pid},"
        )
        assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]
    finally:
        holder.kill()
        holder.wait()
    # The kernel released the lock of the killed holder: the directory is usable again.
    RunDirectory.open(tiny_train(run_dir)).close()


@pytest.mark.slow
def test_two_trainings_on_one_run_directory(tmp_path: Path, marker: str) -> None:
    """A second ``turnrl train --resume`` while the first runs exits 2 naming its pid;
    the first finishes with its steps in order.

    In ``make test-slow`` only (#38: 32 s of the suite). ``make test`` covers it with
    ``test_a_locked_run_directory_is_refused_naming_the_holder``: while another process
    holds the run directory's lock, ``turnrl train --resume`` (of an agent run, as here)
    and ``turnrl iterate --resume`` exit 2 with one line naming its pid and write nothing;
    and the lock is the kernel's (released when its holder dies)."""
    flag = tmp_path / "hold"
    flag.touch()
    args = agent_args(tmp_path, f"agent.entrypoint={entry('hold_while_flag')}", "train.steps=1")
    env = subprocess_env(HOSTILE_FLAG=str(flag))
    first = subprocess.Popen(
        [sys.executable, "-m", "turnrl.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_dir = tmp_path / "run"
    lock = run_dir / LOCK_FILE
    try:
        wait_until(
            lambda: lock.exists() and lock.read_text().strip() == str(first.pid),
            what="the first run to lock its directory",
        )
        second = subprocess.run(
            [sys.executable, "-m", "turnrl.cli", *args, "--resume"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert second.returncode == 2
        err = error_lines(second.stderr)
        assert len(err) == 1, second.stderr
        assert f"is in use by another turnrl process (pid {first.pid}," in err[0]
    finally:
        flag.unlink()
    _, err_text = first.communicate(timeout=300)
    assert first.returncode == 0, err_text
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1]
    assert marker_processes(marker) == []


# --------------------------------------------------------------- 3. rewards that overflow


def test_a_huge_reward_fails_the_rollout_naming_the_accepted_range(
    served: tuple[Gateway, GatewayServer], tmp_path: Path
) -> None:
    results = run_batch(served, make_program(entry("huge_reward"), None), tasks(2))
    expected = (
        "the reward 1e+308 is outside the accepted range |reward| <= 1e+06 "
        "(larger values overflow the advantages)"
    )
    assert [r.failure.reason for r in results] == [expected, expected]
    assert MAX_ABS_REWARD == 1e6


def test_a_run_whose_agents_all_return_huge_rewards_stops_before_any_update(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    code = turnrl_main(agent_args(tmp_path, f"agent.entrypoint={entry('huge_reward')}"))
    err = error_lines(capsys.readouterr().err)
    assert code == 2
    assert err[-1].startswith("turnrl train: error: 2 of 2 agent rollouts failed in eval-000000")
    assert "outside the accepted range |reward| <= 1e+06" in err[-1]
    assert not (run_dir / "checkpoints").exists()
    assert (run_dir / "config.toml").is_file()


def records_with_rewards(rewards: list[list[float]]) -> list[TurnRecord]:
    """One task, one rollout per inner list, one turn per reward."""
    out = []
    for g, turns in enumerate(rewards):
        for t, reward in enumerate(turns):
            out.append(
                TurnRecord(
                    task_id="q",
                    traj_id=f"roll-{g}",
                    turn=t,
                    prompt=f"p{g}-{t}",
                    response="r",
                    prompt_ids=[1, 2],
                    response_ids=[3],
                    logprobs=[-0.5],
                    reward=reward,
                    done=t == len(turns) - 1,
                )
            )
    return out


def test_rewards_outside_the_range_are_refused_before_the_update() -> None:
    """1e308 and -1e308 in one group: the std overflows and grpo's advantages are
    silently 0; the update is refused on the rewards."""
    records = records_with_rewards([[0.5], [1e308], [-1e308]])
    table = TurnTable.from_records(records)
    with np.errstate(over="ignore"):
        advantages = compute_credit(table, "grpo").advantages
    assert advantages.tolist() == [0.0, 0.0, -0.0]  # nothing to learn from: silently
    with pytest.raises(CreditOverflowError) as refused:
        build_update_batch(records, table, advantages, None, "token_mean")
    assert str(refused.value) == (
        "refusing the update: the reward of rollout roll-1 (task q, turn 0) is 1e+308 "
        "(2 of 3 rows); rewards must lie in |reward| <= 1e+06 (this rollout's rewards: "
        "[1e+308])"
    )


def test_non_finite_advantages_are_refused_naming_the_turn() -> None:
    records = records_with_rewards([[0.5, 6e5, 6e5]] * 1 + [[0.0, 0.0, 0.0]])
    table = TurnTable.from_records(records)
    check_finite_credit(table, np.ones(6))  # a return of 1.2e6 is fine
    advantages = np.array([0.1, 0.2, np.nan, 0.0, 1e39, 0.0])
    with pytest.raises(CreditOverflowError) as refused:
        build_update_batch(records, table, advantages, None, "token_mean")
    assert str(refused.value) == (
        "refusing the update: the advantage of rollout roll-0 (task q, turn 2) is nan "
        "(2 of 6 rows); rewards must lie in |reward| <= 1e+06 (this rollout's rewards: "
        "[0.5, 600000, 600000])"
    )


# --------------------------------------------------------------------------- 4. disk full


class FullDisk:
    """A file object that takes ``room`` bytes, then fails like a full disk."""

    def __init__(self, handle: Any, room: int) -> None:
        self.handle = handle
        self.room = room

    def write(self, data: Any) -> int:
        data = bytes(data)
        if len(data) > self.room:
            self.handle.write(data[: self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.handle.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)

    def __enter__(self) -> FullDisk:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.handle.close()


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def started_run(tmp_path: Path, tiny_train: Any) -> RunDirectory:
    run = RunDirectory.open(tiny_train(tmp_path / "run"))
    run.start()
    run.append_metrics({"step": 0, "x": 1.0})
    run.save_checkpoint(1, {"w": torch.ones(3)}, {"state": {}, "param_groups": []})
    return run


def test_a_full_disk_during_a_checkpoint_names_the_cause_and_keeps_the_last_one(
    started_run: RunDirectory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import turnrl.io

    before = snapshot(started_run.path)
    real_fdopen = os.fdopen
    monkeypatch.setattr(
        turnrl.io.os, "fdopen", lambda fd, mode: FullDisk(real_fdopen(fd, mode), 300)
    )
    with pytest.raises(OutputError) as refused:
        started_run.save_checkpoint(2, {"w": torch.ones(1000)}, None)
    monkeypatch.undo()
    target = started_run.path / "checkpoints" / "step-000002.pt"
    assert str(refused.value) == f"{target}: cannot write: no space left on device"
    assert snapshot(started_run.path) == before  # no temporary file, latest unchanged


def test_a_full_disk_during_a_metrics_append_leaves_the_log_as_it_was(
    started_run: RunDirectory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins

    import turnrl.io

    before = snapshot(started_run.path)

    def open_full(*args: Any, **kwargs: Any) -> FullDisk:
        return FullDisk(builtins.open(*args, **kwargs), 5)

    monkeypatch.setattr(turnrl.io, "open", open_full, raising=False)
    with pytest.raises(OutputError) as refused:
        started_run.append_metrics({"step": 1, "x": 2.0})
    monkeypatch.undo()
    assert str(refused.value) == (
        f"{started_run.metrics_path}: cannot write: no space left on device"
    )
    assert snapshot(started_run.path) == before  # the partial line was cut off again


def test_a_full_disk_during_the_warm_start_save_leaves_no_half_directory(
    started_run: RunDirectory, policy: HFPolicy, monkeypatch: pytest.MonkeyPatch, tiny_train: Any
) -> None:
    from safetensors import SafetensorError

    warm = tiny_train(started_run.path, "warm_start.steps=0").warm_start
    started_run.warm_start(policy, warm, list, seed=0)
    first = snapshot(started_run.warm_start_dir)
    assert "model.safetensors" in first

    def save_then_fill_the_disk(directory: Path) -> None:
        (Path(directory) / "config.json").write_text("{}")
        raise SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "'
            + os.strerror(errno.ENOSPC)
            + '" })'
        )

    monkeypatch.setattr(policy, "save", save_then_fill_the_disk)
    with pytest.raises(OutputError) as refused:
        started_run.warm_start(policy, warm, list, seed=0)
    assert str(refused.value) == (
        f"{started_run.warm_start_dir}: cannot write: no space left on device"
    )
    assert snapshot(started_run.warm_start_dir) == first  # the earlier save, whole
    assert [p.name for p in started_run.path.iterdir() if p.name.endswith(".tmp")] == []


def test_replace_directory_swaps_a_whole_directory_or_keeps_the_old_one(tmp_path: Path) -> None:
    from turnrl.io import replace_directory

    target = tmp_path / "saved"
    target.mkdir()
    (target / "old.bin").write_bytes(b"old")
    with replace_directory(target) as directory:
        assert directory == target and list(target.iterdir()) == []  # the old one is aside
        (directory / "new.bin").write_bytes(b"new")
    assert snapshot(target) == {"new.bin": b"new"}
    quota = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
    with (
        pytest.raises(OutputError, match="cannot write: disk quota exceeded"),
        replace_directory(target) as directory,
    ):
        (directory / "half.bin").write_bytes(b"half")
        raise quota
    assert snapshot(target) == {"new.bin": b"new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Any]:
    """``mount(size, read_only=False)``: a real small tmpfs (root only), unmounted after."""
    mounted: list[Path] = []

    def mount(size: str, *, read_only: bool = False) -> Path:
        target = tmp_path / f"fs{len(mounted)}"
        target.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
        mounted.append(target)
        return target

    yield mount
    for target in mounted:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def test_a_real_full_disk_checkpoint_and_warm_start(
    tiny_tmpfs: Any, tiny_train: Any, policy: HFPolicy
) -> None:
    disk = tiny_tmpfs("256k")
    run = RunDirectory.open(tiny_train(disk / "run"))
    run.start()
    run.save_checkpoint(1, {"w": torch.ones(4)}, None)
    before = snapshot(run.path)
    with pytest.raises(OutputError) as refused:
        run.save_checkpoint(2, {"w": torch.ones(1_000_000)}, None)  # 4 MB
    assert str(refused.value) == (
        f"{run.path / 'checkpoints' / 'step-000002.pt'}: cannot write: no space left on device"
    )
    assert snapshot(run.path) == before
    with pytest.raises(OutputError) as refused:
        run.warm_start(policy, tiny_train(run.path, "warm_start.steps=0").warm_start, list, seed=0)
    assert str(refused.value) == f"{run.warm_start_dir}: cannot write: no space left on device"
    assert not run.warm_start_dir.exists()
    assert snapshot(run.path) == before


def test_turnrl_train_on_a_full_disk_exits_2_with_one_line(
    tiny_tmpfs: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    disk = tiny_tmpfs("64k")
    run_dir = disk / "run"
    code = turnrl_main(
        agent_args(tmp_path, f"agent.entrypoint={entry('exits_0')}", run_dir=run_dir)
    )
    err = error_lines(capsys.readouterr().err)
    assert code == 2
    assert err == [
        f"turnrl train: error: {run_dir / 'warm_start'}: cannot write: no space left on device"
    ]
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE, "config.toml"]


# ------------------------------------------------------------ 5. SIGTERM and SIGINT


@pytest.mark.parametrize(
    "stop",
    [
        pytest.param(signal.SIGTERM, id="SIGTERM"),
        pytest.param(signal.SIGINT, id="SIGINT", marks=pytest.mark.slow),
    ],
)
def test_a_stop_signal_kills_every_agent_process_and_resume_continues(
    tmp_path: Path,
    marker: str,
    stop: signal.Signals,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A trainer with hanging command agents (and their children) gets a stop signal:
    one line, exit code 128 + signal, no process left, nothing partial; ``--resume``
    finishes the run.

    The SIGINT variant is in ``make test-slow`` only (#38: 46 s of the suite). ``make
    test`` runs the SIGTERM variant of this whole path, and SIGINT goes through the same
    handler (``STOP_SIGNALS``): ``test_sigint_stops_the_run_body_as_sigterm_does`` checks
    that SIGINT raises the same ``RunInterrupted`` (exit code 130) and kills what was
    started inside."""
    flag = tmp_path / "hang"
    run_dir = tmp_path / "run"
    args = agent_args(
        tmp_path,
        "agent.command=" + json.dumps(command("spawns_and_hangs")),
        "train.steps=3",
    )
    env = subprocess_env(HOSTILE_FLAG=str(flag), PYTHONFAULTHANDLER="1")
    trainer = subprocess.Popen(
        [sys.executable, "-m", "turnrl.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: (run_dir / "checkpoints" / "step-000001.pt").exists() or trainer.poll(),
            what="the first checkpoint",
        )
        assert trainer.poll() is None
        flag.touch()  # the next agents spawn children (one with setsid) and hang
        pids = tmp_path / "pids"
        wait_until(
            lambda: pids.exists() and len(pids.read_text().split()) >= 4,
            what="hanging agents with children",
        )
        assert len(marker_processes(marker)) >= 4
        trainer.send_signal(stop)
        err = communicate_or_dump(trainer, timeout=120)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    assert trainer.returncode == 128 + stop
    lines = error_lines(err)
    assert len(lines) == 1, err
    assert lines[0].startswith(f"turnrl train: stopped by {stop.name}; last checkpoint: step ")
    assert lines[0].endswith(f"continue with --resume --run-dir {run_dir}")
    assert marker_processes(marker) == []
    # Nothing partial: no temporary file, every metrics line whole.
    assert [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")] == []
    saved = list_checkpoints(run_dir)[-1][0]
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")][: saved + 1] == list(
        range(saved + 1)
    )
    flag.unlink()
    monkeypatch.setenv("HOSTILE_FLAG", str(flag))  # the agents' environment
    assert turnrl_main([*args, "--resume"]) == 0, capsys.readouterr().err  # in this process
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1, 2, 3]
    assert marker_processes(marker) == []


def test_a_stop_whose_raise_was_lost_is_raised_again() -> None:
    """A stop signal landing inside a callback whose exceptions Python only prints
    (logging's after-fork hook, a finaliser) loses its ``RunInterrupted``; the watchdog
    raises it again until the body unwinds, so the run still stops."""
    from turnrl.train.stop_signals import RETRY_S, RunInterrupted, stopping_on_signals

    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RunInterrupted) as stopped, stopping_on_signals():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # the signal interrupts this
        except RunInterrupted:
            pass  # lost, as in an "Exception ignored in ..." callback
        for _ in range(int(60 / RETRY_S)):
            time.sleep(RETRY_S)  # a repeat interrupts this
        pytest.fail("the lost stop was never raised again")
    assert stopped.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is handler


def test_a_stop_lost_in_a_task_nobody_awaits_still_stops_an_idle_event_loop() -> None:
    """The SIGTERM hang of stop 45's CI (a trainer still running 120 s after the
    signal, saying nothing): the signal lands while a task nobody awaits runs (the agent
    runner's pipe readers), asyncio stores the ``RunInterrupted`` in that task, and the
    loop goes back to waiting in its selector until the next timer (the agents'
    timeout). A repeat must wake the selector, as a signal does; scheduling the handler
    (``_thread.interrupt_main``) does not, so this waited the whole sleep."""
    import asyncio

    from turnrl.train.stop_signals import RunInterrupted, stopping_on_signals

    async def body() -> None:
        async def reader() -> None:  # a pipe reader: its exceptions are kept, not raised
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # the signal interrupts this: the raise is stored in the task
            pytest.fail("the stop did not interrupt the reader")

        reading = asyncio.ensure_future(reader())
        await asyncio.sleep(0)  # the reader runs, and takes the stop
        assert reading.done()
        await asyncio.sleep(120)  # the loop idles in its selector (the agents' timeout)

    started = time.monotonic()
    with pytest.raises(RunInterrupted), stopping_on_signals():
        asyncio.run(body())
    assert time.monotonic() - started < 60, "the repeat did not wake the idle loop"


def test_repeats_do_not_interrupt_the_unwinding_of_the_first_stop() -> None:
    """While the first ``RunInterrupted`` propagates (cleanup in ``finally`` blocks that
    take longer than the watchdog's period), the repeats are ignored: the cleanup runs
    to its end and the body raises once."""
    from turnrl.train.stop_signals import RETRY_S, RunInterrupted, stopping_on_signals

    cleaned: list[str] = []
    with pytest.raises(RunInterrupted), stopping_on_signals():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # the signal interrupts this
        finally:
            for _ in range(3):
                time.sleep(RETRY_S)  # a repeat arrives during each
            cleaned.append("to the end")
    assert cleaned == ["to the end"]


def test_sigint_stops_the_run_body_as_sigterm_does(marker: str) -> None:
    """Ctrl-C inside ``stopping_on_signals``: ``RunInterrupted`` for SIGINT (exit code
    130, the line ``cli.main`` prints), every process started inside killed (also one
    in its own session), the previous SIGINT handler back."""
    from turnrl.train.stop_signals import STOP_SIGNALS, RunInterrupted, stopping_on_signals

    assert signal.SIGINT in STOP_SIGNALS and signal.SIGTERM in STOP_SIGNALS
    handler = signal.getsignal(signal.SIGINT)
    children: list[subprocess.Popen[bytes]] = []
    with pytest.raises(RunInterrupted) as stopped, stopping_on_signals():
        for session in (False, True):
            children.append(
                subprocess.Popen(
                    [sys.executable, "-c", "import time; time.sleep(3600)", marker],
                    start_new_session=session,
                )
            )
        wait_until(lambda: len(marker_processes(marker)) == 2, timeout=30, what="children")
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)  # the signal interrupts this
    assert stopped.value.signum == signal.SIGINT
    assert stopped.value.exit_code == 130
    assert str(stopped.value) == "stopped by SIGINT"
    assert signal.getsignal(signal.SIGINT) is handler
    assert marker_processes(marker) == []  # killed and reaped on the way out
    for child in children:
        child.wait(timeout=30)  # already reaped: only settles the Popen objects


def test_an_agent_process_that_escapes_its_group_is_killed_at_the_end_of_the_batch(
    served: tuple[Gateway, GatewayServer], marker: str, tmp_path: Path
) -> None:
    from turnrl.train.process_tree import subreaper

    with subreaper() as works:
        if not works:
            pytest.skip("no PR_SET_CHILD_SUBREAPER here")
    assert not is_subreaper()  # only for the batch
    results = run_batch(served, make_program(None, command("escapes_and_exits")), tasks(2))
    assert [r.failure for r in results] == [None, None]
    assert len((tmp_path / "pids").read_text().split()) == 2
    assert marker_processes(marker) == []
    assert not is_subreaper()


# ------------------------------------------------- 6. an async agent that blocks its loop


def test_an_async_agent_blocking_its_event_loop_still_times_out(
    served: tuple[Gateway, GatewayServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOSTILE_BLOCK_S", "15")
    results = run_batch(
        served,
        make_program(entry("async_blocks_loop"), None),
        tasks(1),
        timeout_s=3.0,
        failure_dir=tmp_path,
    )
    assert [r.failure.reason for r in results] == ["timed out after 3 s"]
    saved = (tmp_path / "r0.txt").read_text()
    assert "time.sleep(float(os.environ.get" in saved  # where it was blocking


# --------------------------------------------------------------- 7. a 10 MB reward line


def test_a_reward_line_over_the_limit_is_reported_as_too_long(
    served: tuple[Gateway, GatewayServer], tmp_path: Path, marker: str
) -> None:
    results = run_batch(
        served, make_program(None, command("huge_reward_line")), tasks(1), failure_dir=tmp_path
    )
    (result,) = results
    assert result.failure is not None
    printed = len(json.dumps({"reward": 1.0, "info": {"pad": "x" * 10 * 1024 * 1024}})) + 1
    assert result.failure.reason == (
        f"the last line of stdout (the reward line) is too long: over {OUTPUT_TAIL_BYTES} "
        f"bytes, the most a reward line may have ({printed:,} bytes of stdout in all)"
    )
    assert OUTPUT_TAIL_BYTES == 64 * 1024
    assert marker_processes(marker) == []


# ------------------------------------------------ 8. bad commands, before any work; big tasks


def test_a_task_over_128_kib_reaches_a_command_through_its_file(
    served: tuple[Gateway, GatewayServer],
) -> None:
    blob = "y" * (200 * 1024)
    big = Task("big-0", {"task_id": "big-0", "blob": blob})
    small = Task("small-0", {"task_id": "small-0", "blob": "z"})
    results = run_batch(served, make_program(None, command("big_task")), [big, small])
    assert [r.failure for r in results] == [None, None]
    assert [r.info["blob_bytes"] for r in results] == [len(blob), 1]
    assert [r.info["env_has_task"] for r in results] == [False, True]
    assert TASK_ENV_MAX_BYTES < 200 * 1024
    assert not any(Path(r.info["task_file"]).exists() for r in results)  # removed after


@pytest.mark.parametrize(
    ("script", "mode", "message"),
    [
        ("#!/bin/sh\necho hi\n", 0o644, "is not executable (chmod +x)"),
        (
            "#!/no/such/interpreter\necho hi\n",
            0o755,
            "names the interpreter '/no/such/interpreter' in its #! line, which does not exist",
        ),
        (
            "#!/usr/bin/env no-such-interpreter-xyz\necho hi\n",
            0o755,
            "names the interpreter '/usr/bin/env no-such-interpreter-xyz' in its #! line, "
            "which does not exist",
        ),
    ],
    ids=["not-executable", "missing-interpreter", "missing-env-interpreter"],
)
def test_a_bad_agent_command_is_a_config_error_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], script: str, mode: int, message: str
) -> None:
    agent = tmp_path / "agent.sh"
    agent.write_text(script)
    agent.chmod(mode)
    run_dir = tmp_path / "run"
    code = turnrl_main(agent_args(tmp_path, f'agent.command=["{agent}"]'))
    err = error_lines(capsys.readouterr().err)
    assert code == 2
    assert err == [f"turnrl train: error: agent.command: program '{agent}' {message}"]
    assert not run_dir.exists()  # before any work
    with pytest.raises(AgentConfigError):
        make_program(None, [str(agent)])


# --------------------------------------------------------- 9. run directories that fail


def test_a_run_dir_under_a_read_only_parent_exits_2_with_one_line(
    tiny_tmpfs: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = tiny_tmpfs("64k", read_only=True)
    run_dir = parent / "run"
    code = turnrl_main(
        agent_args(tmp_path, f"agent.entrypoint={entry('exits_0')}", run_dir=run_dir)
    )
    err = error_lines(capsys.readouterr().err)
    assert code == 2
    assert err == [
        f"turnrl train: error: run_dir {run_dir}: cannot create it in {parent} "
        "(read-only file system)"
    ]


def test_a_run_dir_deleted_mid_run_exits_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    monkeypatch.setenv("HOSTILE_RUN_DIR", str(run_dir))
    code = turnrl_main(agent_args(tmp_path, f"agent.entrypoint={entry('deletes_run_dir')}"))
    err = error_lines(capsys.readouterr().err)
    assert code == 2
    assert err == [
        f"turnrl train: error: run_dir {run_dir} was deleted or replaced while the run was "
        "running; stopped without writing more"
    ]
    assert not run_dir.exists()  # not recreated


def test_resume_without_a_readable_checkpoint_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    args = agent_args(tmp_path, f"agent.entrypoint={entry('exits_0')}")
    config = load_config(RunConfig, None, [f"run_dir={run_dir}", *args[4:]])
    RunDirectory.open(config).start()
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "step-000001.pt").write_bytes(b"not a checkpoint")
    before = snapshot(run_dir)
    code = turnrl_main([*args, "--resume"])
    err = error_lines(capsys.readouterr().err)
    assert code == 2
    assert len(err) == 1
    assert err[0].startswith(
        f"turnrl train: error: cannot resume {run_dir}: no readable checkpoint "
        f"({run_dir / 'checkpoints' / 'step-000001.pt'}: unreadable checkpoint"
    )
    assert err[0].endswith(
        "remove the damaged files to resume from an earlier checkpoint, or use --overwrite"
    )
    assert snapshot(run_dir) == before


# ------------------------------------------------------------- 10. tasks.eval with a file


def test_a_task_file_without_eval_tasks_is_refused_as_documented(tmp_path: Path) -> None:
    from turnrl.train.config import TasksConfig, field_docs
    from turnrl.train.validate import ConfigError, validate

    train = write_tasks(tmp_path / "train.jsonl", 4)
    config = load_config(
        RunConfig, None, [f"tasks.train={train}", f"agent.entrypoint={entry('exits_0')}"]
    )
    with pytest.raises(ConfigError, match=r"tasks\.eval: needed when tasks\.train is a file"):
        validate(config)
    doc = " ".join(field_docs(TasksConfig)["eval"].split())
    assert "Required when ``train`` is a file" in doc
    assert "no evaluation" not in doc
