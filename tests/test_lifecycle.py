"""The run lifecycle (turnrl.train.lifecycle): the exact order of a trainer's phases on a
fake trainer that records its calls (fresh, periodic evaluation and checkpoints,
resume after a kill, a failing step, a stop signal), and the three real trainers
against the ``Trainer`` protocol."""

from __future__ import annotations

import inspect
import json
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from turnrl.train.agent.loop import AgentTrainer
from turnrl.train.iterate.loop import IterativeGRPO
from turnrl.train.lifecycle import Lifecycle, Trainer, stopping
from turnrl.train.online.ranks import DistributedOnlineTrainer
from turnrl.train.online.trainer import OnlineTrainer
from turnrl.train.run import Checkpoint, RunDirectory
from turnrl.train.schedule import Schedule
from turnrl.train.stop_signals import RunInterrupted


class Boom(RuntimeError):
    pass


class FakeTrainer:
    """A trainer whose every phase appends ``(phase, step)`` to ``calls``; its state is
    one counter, saved in real checkpoints of a real run directory."""

    def __init__(
        self,
        run_directory: RunDirectory,
        schedule: Schedule,
        *,
        fail_setup: bool = False,
        fail_at: int | None = None,
        signal_at: int | None = None,
    ) -> None:
        self.run_directory = run_directory
        self._schedule = schedule
        self.fail_setup = fail_setup
        self.fail_at = fail_at
        self.signal_at = signal_at
        self.calls: list[tuple[str, int | None]] = []
        self.step = 0

    @property
    def schedule(self) -> Schedule:
        return self._schedule

    def setup(self, checkpoint: Checkpoint | None) -> int:
        self.calls.append(("setup", None if checkpoint is None else checkpoint.step))
        if self.fail_setup:
            raise Boom("setup failed")
        if checkpoint is None:  # a saved warm start, as every trainer leaves (resume checks it)
            warm = self.run_directory.warm_start_dir
            warm.mkdir(exist_ok=True)
            (warm / "config.json").write_text("{}")
            save_file({"w": torch.zeros(2)}, str(warm / "model.safetensors"))
        if checkpoint is not None:
            self.step = int(checkpoint.extra["step"])
        return self.step

    def start_metrics(self) -> dict[str, Any]:
        self.calls.append(("start_metrics", self.step))
        return {"eval": 0.0}

    def train_step(self, step: int) -> dict[str, Any]:
        self.calls.append(("train_step", step))
        if step == self.fail_at:
            raise Boom(f"step {step} failed")
        if step == self.signal_at:
            os.kill(os.getpid(), signal.SIGTERM)
        self.step = step
        return {"step": step, "loss": float(step)}

    def evaluate(self) -> dict[str, float]:
        self.calls.append(("evaluate", self.step))
        return {"eval": float(self.step)}

    def checkpoint(self) -> None:
        self.calls.append(("checkpoint", self.step))
        # what every trainer saves (a resumed run checks it all: payload_problem)
        weights = {"w": torch.full((2,), float(self.step))}
        optimizer = {"state": {}, "param_groups": []}
        sampler = np.random.default_rng(self.step).bit_generator.state
        extra = {"step": self.step, "sampler": sampler}
        self.run_directory.save_checkpoint(self.step, weights, optimizer, extra)

    def describe(self, row: Mapping[str, Any]) -> str:
        self.calls.append(("describe", row["step"]))
        return f"step {row['step']}"

    def finish(self) -> None:
        self.calls.append(("finish", self.step))

    def close(self) -> None:
        self.calls.append(("close", self.step))
        self.run_directory.close()


def fake(
    tiny_train: Any, run_dir: Path, schedule: Schedule, *, resume: bool = False, **kwargs: Any
) -> FakeTrainer:
    config = tiny_train(run_dir, f"train.steps={schedule.steps}")  # the schedule's length
    run = RunDirectory.open(config, resume=resume, quiet=True)
    return FakeTrainer(run, schedule, **kwargs)


def lifecycle(trainer: FakeTrainer, reports: list[Path]) -> Lifecycle:
    return Lifecycle(trainer, report=reports.append)


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_fresh_run_order_with_periodic_evaluation_and_checkpoints(
    tmp_path: Path, tiny_train: Any
) -> None:
    trainer = fake(tiny_train, tmp_path, Schedule(5, eval_every=2, checkpoint_every=3))
    reports: list[Path] = []
    assert lifecycle(trainer, reports).run() == tmp_path
    assert trainer.calls == [
        ("setup", None),
        ("start_metrics", 0),
        ("train_step", 1),
        ("describe", 1),
        ("train_step", 2),
        ("evaluate", 2),
        ("describe", 2),
        ("train_step", 3),
        ("checkpoint", 3),
        ("describe", 3),
        ("train_step", 4),
        ("evaluate", 4),
        ("describe", 4),
        ("train_step", 5),  # the last step always evaluates and checkpoints
        ("evaluate", 5),
        ("checkpoint", 5),
        ("describe", 5),
        ("finish", 5),
        ("close", 5),
    ]
    assert reports == [tmp_path]
    assert metrics(tmp_path) == [
        {"step": 0, "eval": 0.0},
        {"step": 1, "loss": 1.0},
        {"step": 2, "loss": 2.0, "eval": 2.0},
        {"step": 3, "loss": 3.0},
        {"step": 4, "loss": 4.0, "eval": 4.0},
        {"step": 5, "loss": 5.0, "eval": 5.0},
    ]


def test_a_killed_run_resumes_after_its_last_checkpoint(tmp_path: Path, tiny_train: Any) -> None:
    schedule = Schedule(5, eval_every=0, checkpoint_every=2)
    killed = fake(tiny_train, tmp_path, schedule)
    reports: list[Path] = []
    lifecycle(killed, reports).run(stop_after=3)  # killed after step 3, checkpoint at 2
    assert killed.calls == [
        ("setup", None),
        ("start_metrics", 0),
        ("train_step", 1),
        ("describe", 1),
        ("train_step", 2),
        ("checkpoint", 2),
        ("describe", 2),
        ("train_step", 3),
        ("describe", 3),
        ("close", 3),  # no finish, no report: the run is not done
    ]
    assert reports == []
    assert [row["step"] for row in metrics(tmp_path)] == [0, 1, 2, 3]

    resumed = fake(tiny_train, tmp_path, schedule, resume=True)
    lifecycle(resumed, reports).run()
    assert resumed.calls == [
        ("setup", 2),  # no step-0 evaluation again; step 3 is redone
        ("train_step", 3),
        ("describe", 3),
        ("train_step", 4),
        ("checkpoint", 4),
        ("describe", 4),
        ("train_step", 5),
        ("evaluate", 5),
        ("checkpoint", 5),
        ("describe", 5),
        ("finish", 5),
        ("close", 5),
    ]
    assert reports == [tmp_path]
    assert [row["step"] for row in metrics(tmp_path)] == [0, 1, 2, 3, 4, 5]

    done = fake(tiny_train, tmp_path, schedule, resume=True)  # a finished run: nothing to do
    lifecycle(done, reports).run()
    assert done.calls == [("setup", 5), ("finish", 5), ("close", 5)]


def test_close_runs_when_a_step_or_the_setup_raises(tmp_path: Path, tiny_train: Any) -> None:
    trainer = fake(tiny_train, tmp_path / "a", Schedule(3), fail_at=2)
    reports: list[Path] = []
    with pytest.raises(Boom, match="step 2 failed"):
        lifecycle(trainer, reports).run()
    assert trainer.calls == [
        ("setup", None),
        ("start_metrics", 0),
        ("train_step", 1),
        ("describe", 1),
        ("train_step", 2),
        ("close", 1),
    ]
    assert reports == []
    assert [row["step"] for row in metrics(tmp_path / "a")] == [0, 1]

    broken = fake(tiny_train, tmp_path / "b", Schedule(3), fail_setup=True)
    with pytest.raises(Boom, match="setup failed"):
        lifecycle(broken, reports).run()
    assert broken.calls == [("setup", None), ("close", 0)]
    assert reports == []


def test_a_stop_signal_abandons_the_step_closes_and_says_how_to_resume(
    tmp_path: Path, tiny_train: Any
) -> None:
    trainer = fake(tiny_train, tmp_path, Schedule(4, checkpoint_every=1), signal_at=3)
    reports: list[Path] = []
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RunInterrupted) as stopped, stopping(tmp_path):
        lifecycle(trainer, reports).run()
    assert signal.getsignal(signal.SIGTERM) is handler  # restored on the way out
    assert stopped.value.exit_code == 128 + signal.SIGTERM
    assert stopped.value.__notes__ == [
        f"last checkpoint: step 2; continue with --resume --run-dir {tmp_path}"
    ]
    assert trainer.calls[-3:] == [("describe", 2), ("train_step", 3), ("close", 2)]
    assert reports == []
    assert [row["step"] for row in metrics(tmp_path)] == [0, 1, 2]


@settings(max_examples=40, deadline=None)
@given(
    steps=st.integers(1, 12),
    eval_every=st.integers(0, 5),
    checkpoint_every=st.integers(0, 5),
)
def test_schedule_ends_with_an_evaluation_and_a_checkpoint(
    steps: int, eval_every: int, checkpoint_every: int
) -> None:
    schedule = Schedule(steps, eval_every, checkpoint_every)
    evaluated = [s for s in range(1, steps + 1) if schedule.evaluates(s)]
    saved = [s for s in range(1, steps + 1) if schedule.checkpoints(s)]
    assert evaluated[-1] == saved[-1] == steps
    every = set(range(eval_every, steps + 1, eval_every)) if eval_every else set()
    assert set(evaluated) == every | {steps}
    every = set(range(checkpoint_every, steps + 1, checkpoint_every)) if checkpoint_every else set()
    assert set(saved) == every | {steps}


PHASES = (
    "setup",
    "start_metrics",
    "train_step",
    "evaluate",
    "checkpoint",
    "describe",
    "finish",
    "close",
)


@pytest.mark.parametrize(
    "cls", [OnlineTrainer, DistributedOnlineTrainer, AgentTrainer, IterativeGRPO, FakeTrainer]
)
def test_the_trainers_have_the_protocols_phases_with_its_arguments(cls: type) -> None:
    assert isinstance(inspect.getattr_static(cls, "schedule"), property)
    for name in PHASES:
        wanted = list(inspect.signature(getattr(Trainer, name)).parameters)
        got = inspect.signature(getattr(cls, name)).parameters
        assert list(got)[: len(wanted)] == wanted, (cls.__name__, name)
        extra = list(got.values())[len(wanted) :]
        assert all(p.default is not inspect.Parameter.empty for p in extra), (cls, name)


def test_a_real_trainer_is_a_trainer_and_runs_through_the_lifecycle(
    tmp_path: Path, tiny_train: Any
) -> None:
    trainer = OnlineTrainer(
        tiny_train(tmp_path, "train.steps=2", "train.eval_every=0", "warm_start.steps=0"),
        quiet=True,
    )
    assert isinstance(trainer, Trainer)
    assert not isinstance(object(), Trainer)
    assert trainer.schedule == Schedule(2, 0, trainer.config.train.checkpoint_every, label="RL")
    Lifecycle(trainer).run()
    assert [row["step"] for row in metrics(tmp_path)] == [0, 1, 2]
    assert "eval_success" in metrics(tmp_path)[-1] and "eval_success" not in metrics(tmp_path)[1]


class SavedPolicy:
    """Enough of a policy for ``RunDirectory.warm_start``: it saves one file."""

    def save(self, directory: Path) -> None:
        (Path(directory) / "weights.txt").write_text("w\n")


@pytest.mark.parametrize(
    ("section", "overrides", "budget"),
    [
        ("train", ["train.update=tree", "train.max_tokens_per_batch=96"], 96),
        ("train", ["train.update=rows", "train.max_tokens_per_batch=96"], None),
        ("improve", ["improve.update=tree", "improve.max_tokens_per_batch=64"], 64),
    ],
)
def test_the_warm_start_batches_as_the_update_section_it_is_given(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    section: str,
    overrides: list[str],
    budget: int | None,
) -> None:
    from turnrl.train.config import RunConfig, load_config
    from turnrl.train.iterate.config import IterateConfig
    from turnrl.train.update import sft

    seen: list[int | None] = []

    def fake_warm_start(*args: Any, max_tokens_per_batch: int | None, **kwargs: Any) -> list:
        seen.append(max_tokens_per_batch)
        return [1.0]

    monkeypatch.setattr(sft, "supervised_warm_start", fake_warm_start)
    cls = RunConfig if section == "train" else IterateConfig
    config = load_config(cls, None, [f"run_dir={tmp_path}", "warm_start.steps=2", *overrides])
    run = RunDirectory.open(config, quiet=True)
    run.start()
    run.warm_start(SavedPolicy(), config.warm_start, list, seed=0, update=getattr(config, section))
    run.close()
    assert seen == [budget]
    assert (tmp_path / "warm_start" / "weights.txt").read_text() == "w\n"
