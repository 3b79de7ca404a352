"""A run releases the sampler it built (#26): a vLLM engine's core must not outlive the run.

The main venv has no vllm: a separate in-process copy of the learner with a recording
``close`` stands in for the engine (``tests/test_vllm_backend.py`` checks the real
engine in ``.venv-vllm``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

import turnrl.train.online.trainer as online
from turnrl.policy.factory import build_tiny_policy, close_sampler
from turnrl.train.online.trainer import OnlineTrainer

torch.set_num_threads(1)


class Recorder:
    """A sampler that only records how often it was closed."""

    def __init__(self) -> None:
        self.closes = 0

    def close(self) -> None:
        self.closes += 1


def test_close_sampler_closes_a_separate_sampler_and_never_the_learner() -> None:
    learner = build_tiny_policy(0)
    learner.close = lambda: pytest.fail("the learner is not the sampler's to close")  # type: ignore[attr-defined]
    close_sampler(learner, learner)  # backend hf: the learner samples, nothing to release
    close_sampler(learner, None)  # a run that stopped before it built a sampler
    sampler = Recorder()
    close_sampler(learner, sampler)
    assert sampler.closes == 1
    close_sampler(learner, object())  # a sampler without close (an in-process copy): nothing


def _separate_copies(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Make the trainer sample with a closable copy of its learner; returns the copies."""
    made: list[Any] = []

    def separate_copy(settings: Any, learner: Any, **options: Any) -> Any:
        sampler = copy.deepcopy(learner)
        sampler.closes = 0

        def close() -> None:
            sampler.closes += 1

        sampler.close = close
        made.append(sampler)
        return sampler

    monkeypatch.setattr(online, "build_sampler", separate_copy)
    return made


def test_a_finished_run_closes_its_sampler_once(
    tmp_path: Path, tiny_train: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import PARITY

    made = _separate_copies(monkeypatch)
    config = tiny_train(tmp_path / "run", *PARITY, "train.steps=1", "train.checkpoint_every=0")
    trainer = OnlineTrainer(config, quiet=True)
    trainer.run()
    assert [s.closes for s in made] == [1]
    assert trainer.rollout_policy is made[0]


def test_a_run_that_fails_mid_step_still_closes_its_sampler(
    tmp_path: Path, tiny_train: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import PARITY

    made = _separate_copies(monkeypatch)
    config = tiny_train(tmp_path / "run", *PARITY, "train.steps=2", "train.checkpoint_every=0")
    trainer = OnlineTrainer(config, quiet=True)

    def broken_step(step: int | None = None) -> dict[str, Any]:
        raise RuntimeError("environment crashed")

    monkeypatch.setattr(trainer, "train_step", broken_step)
    with pytest.raises(RuntimeError, match="environment crashed"):
        trainer.run()
    assert [s.closes for s in made] == [1]
