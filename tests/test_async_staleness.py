"""``train.max_staleness`` (#37): the fixed sampling schedule, the runs it refuses, K = 0
equal to the synchronous trainer, and a K = 1 run whose sampler process is killed and
resumed.

Each run is the tiny recipe of ``conftest.TINY_TRAIN`` (4 steps of 2 tasks x 2
rollouts, a checkpoint every 2 steps), with episodes of at most 2 turns.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from turnrl.errors import ConfigError
from turnrl.train.checkpoint import load_latest_checkpoint
from turnrl.train.lifecycle import Lifecycle
from turnrl.train.online.asynchronous import AsyncOnlineTrainer, online_trainer
from turnrl.train.online.trainer import OnlineTrainer
from turnrl.train.staleness import sampling_version, steps_sampled_with
from turnrl.train.validate import validate


def every(n: int):
    return lambda step: step % n == 0


def test_the_schedule_on_a_hand_built_case() -> None:
    """K = 1, checkpoints after steps 3 and 6: the step after a checkpoint samples with
    the checkpoint's weights; otherwise one version behind."""
    versions = [sampling_version(n, 1, every(3)) for n in range(1, 9)]
    assert versions == [0, 0, 1, 3, 3, 4, 6, 6]
    assert steps_sampled_with(0, 1, 8, every(3)) == [1, 2]
    assert steps_sampled_with(2, 1, 8, every(3)) == []
    assert steps_sampled_with(3, 1, 8, every(3)) == [4, 5]
    assert [sampling_version(n, 0, every(3)) for n in range(1, 6)] == [0, 1, 2, 3, 4]


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(0, 5),
    steps=st.integers(1, 40),
    checkpoints=st.sets(st.integers(1, 40), max_size=8),
)
def test_every_step_is_requested_once_in_order_within_k(k, steps, checkpoints) -> None:
    def is_checkpoint(step: int) -> bool:
        return step in checkpoints

    requested = [
        n for version in range(steps) for n in steps_sampled_with(version, k, steps, is_checkpoint)
    ]
    assert requested == list(range(1, steps + 1))
    for n in requested:
        behind = (n - 1) - sampling_version(n, k, is_checkpoint)
        assert 0 <= behind <= k


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("rollout.strategy=rtpo", "on-policy refresh"),
        ("rollout.strategy=patr", "scorer refresh"),
        ("rollout.workers=2", "Ray workers sample in step with the learner"),
        ("train.max_staleness=-1", "must be >= 0"),
    ],
)
def test_runs_that_cannot_be_asynchronous_are_refused(
    tiny_train, tmp_path: Path, override: str, named: str
) -> None:
    extra = [] if "max_staleness" in override else ["train.max_staleness=1"]
    with pytest.raises(ConfigError, match=r"train\.max_staleness") as err:
        validate(tiny_train(tmp_path / "run", *extra, override))
    assert named in str(err.value)


def rollouts(run: Path, step: int) -> str:
    return (run / "rollouts" / f"step-{step:06d}.jsonl").read_text()


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    payload = load_latest_checkpoint(run)
    assert payload is not None
    return payload["model"]


SHORT_EPISODES = ("train.log_rollouts_every=1", "env.env_kwargs={max_turns = 2, turn_cost = 0.0}")
"""Every step's rollouts logged; calculator episodes of at most 2 turns (sampling is most
of a tiny step's time; the schedule and resume checked here do not depend on it)."""


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The synchronous run (field absent) and K = 0, 3 steps each; then K = 1 whole."""
    from conftest import REPO, TINY_TRAIN
    from turnrl.train.config import RunConfig, load_config

    root = tmp_path_factory.mktemp("async")
    done: dict[str, Path] = {}

    def run(name: str, *extra: str) -> Path:
        if name in done:
            return done[name]
        config = load_config(
            RunConfig,
            REPO / "examples" / "calculator.toml",
            [*TINY_TRAIN, *SHORT_EPISODES, f"run_dir={root / name}", *extra],
        )
        trainer = online_trainer(config, quiet=True)
        Lifecycle(trainer).run()
        done[name] = root / name
        return root / name

    return run


def test_k0_is_the_synchronous_trainer_bit_for_bit(runs, tiny_train, tmp_path) -> None:
    assert type(online_trainer(tiny_train(tmp_path / "k0", "train.max_staleness=0"))) is (
        OnlineTrainer
    )
    plain = runs("plain", "train.steps=3")
    zero = runs("zero", "train.steps=3", "train.max_staleness=0")
    for step in (1, 2, 3):
        assert rollouts(plain, step) == rollouts(zero, step)
    assert same_weights(final_weights(plain), final_weights(zero))


def test_k1_samples_ahead_kill_and_resume(runs, read_metrics, tmp_path, monkeypatch, capsys):
    """K = 1: step 1 samples what the synchronous run samples (same weights, seeds and
    ids); steps 2 and 4 one version behind. Killing the sampler process right after
    the push that step 3 samples with stops the run at step 3 with one line (exit 2);
    ``--resume`` from the step-2 checkpoint ends with the uninterrupted run's weights
    and metrics: nothing lost, nothing trained twice, no process left behind."""
    from conftest import REPO, TINY_TRAIN
    from turnrl.cli import main
    from turnrl.train.config import RunConfig, load_config

    whole = runs("whole", "train.max_staleness=1", "train.tis_cap=2.0")
    plain = runs("plain", "train.steps=3")
    step1 = [json.loads(line) for line in rollouts(whole, 1).splitlines()]
    assert {r.pop("policy_version") for r in step1} == {0}  # the sampler's weights
    assert step1 == [json.loads(line) for line in rollouts(plain, 1).splitlines()]
    assert rollouts(whole, 2) != rollouts(plain, 2)
    rows = read_metrics(whole)
    assert [r.get("policy_version") for r in rows[1:]] == [0, 0, 2, 2]
    assert [r.get("staleness_max") for r in rows[1:]] == [0.0, 1.0, 0.0, 1.0]
    raw = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    for key in ("seconds_learner_idle", "seconds_sampler_idle", "seconds_push"):
        assert all(r[key] >= 0.0 for r in raw[1:])
    assert all(0.0 <= r["tis_corrected_frac"] <= 1.0 for r in rows[1:])

    pids: list[int] = []
    send = AsyncOnlineTrainer._send_version

    def send_then_kill(self: AsyncOnlineTrainer) -> None:
        send(self)
        assert self.sampler_process is not None
        pids.append(self.sampler_process.pid)
        if self.policy_version == 2:
            os.kill(self.sampler_process.pid, signal.SIGKILL)

    monkeypatch.setattr(AsyncOnlineTrainer, "_send_version", send_then_kill)
    run = tmp_path / "killed"
    args = [*TINY_TRAIN, *SHORT_EPISODES, "train.max_staleness=1", "train.tis_cap=2.0"]
    code = main(["train", "--quiet", "--config", str(REPO / "examples" / "calculator.toml"),
                 "--run-dir", str(run), *args])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the sampler process (pid" in err[0]
    assert "while step 3 was sampling" in err[0] and "--resume" in err[0]
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]
    for pid in set(pids):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    monkeypatch.undo()

    config = load_config(
        RunConfig, REPO / "examples" / "calculator.toml", [*args, f"run_dir={run}"]
    )
    resumed = online_trainer(config, resume=True, quiet=True)
    Lifecycle(resumed).run()
    assert resumed.sampler_process is not None
    with pytest.raises(ProcessLookupError):
        os.kill(resumed.sampler_process.pid, 0)
    assert read_metrics(run) == rows
    for step in (1, 2, 3, 4):
        assert rollouts(run, step) == rollouts(whole, step)
    assert same_weights(final_weights(run), final_weights(whole))


def test_a_killed_samplers_handshake_error_prints_nothing_else_does() -> None:
    """multiprocessing's resource sharer reports a peer that died mid-handshake through
    ``sys.excepthook`` from its own thread (the stray traceback beside the one line of
    ``test_k1_samples_ahead_kill_and_resume`` in a CI run): the learner's hook drops
    exactly those, connection errors raised in resource_sharer.py, and passes the rest."""
    from turnrl.train.async_sampler import _quiet_peer_deaths

    seen: list[type[BaseException]] = []
    hook = _quiet_peer_deaths(lambda kind, value, tb: seen.append(kind))
    source = "import sys\ndef serve(hook, exc):\n    try:\n        raise exc\n    except BaseException:\n        hook(*sys.exc_info())\n"  # noqa: E501
    namespace: dict = {}
    exec(compile(source, "/py/multiprocessing/resource_sharer.py", "exec"), namespace)
    for exc in (EOFError("x"), ConnectionResetError("x"), ValueError("x")):
        namespace["serve"](hook, exc)
    try:
        raise EOFError("elsewhere")
    except EOFError:
        hook(*sys.exc_info())
    assert seen == [ValueError, EOFError]
