"""Checkpoints: round trip, crash leftovers, pruning, RNG continuation."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from turnrl.train.checkpoint import (
    checkpoint_dir,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
    save_checkpoint,
)

torch.set_num_threads(1)


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


def _draws() -> tuple[list[float], list[float], list[float]]:
    return (
        [random.random() for _ in range(3)],
        np.random.rand(3).tolist(),
        torch.rand(3).tolist(),
    )


def test_no_checkpoint_gives_none(tmp_path: Path) -> None:
    assert load_latest_checkpoint(tmp_path) is None


def test_round_trip(tmp_path: Path) -> None:
    model, optimizer = _model_and_optimizer()
    extra = {
        "env_steps": 120,
        "tags": ["a", "b"],
        "rng": np.random.default_rng(3).bit_generator.state,
    }
    path = save_checkpoint(tmp_path, 7, model.state_dict(), optimizer.state_dict(), extra)
    assert path == checkpoint_dir(tmp_path) / "step-000007.pt"
    assert (checkpoint_dir(tmp_path) / "latest").read_text().strip() == "step-000007.pt"

    payload = load_latest_checkpoint(tmp_path)
    assert payload is not None
    assert payload["step"] == 7
    assert payload["extra"]["env_steps"] == 120
    assert payload["extra"]["tags"] == ["a", "b"]
    restored_rng = np.random.default_rng()
    restored_rng.bit_generator.state = payload["extra"]["rng"]
    assert restored_rng.random() == np.random.default_rng(3).random()

    fresh = torch.nn.Linear(3, 2)
    fresh.load_state_dict(payload["model"])
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    fresh_opt.load_state_dict(payload["optimizer"])
    assert torch.equal(
        fresh_opt.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"]
    )


def test_rng_continuation(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    _draws()  # advance the streams somewhere arbitrary
    save_checkpoint(tmp_path, 1, {}, None)
    expected = _draws()
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    np.random.randn()  # leave a cached gaussian around
    assert _draws() != expected
    load_latest_checkpoint(tmp_path, restore_rng=True)
    assert _draws() == expected


def test_keep_last_prunes_old_checkpoints(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        save_checkpoint(tmp_path, step, {"w": torch.tensor([float(step)])}, None, keep_last=2)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [30, 40]
    payload = load_latest_checkpoint(tmp_path)
    assert payload is not None
    assert payload["step"] == 40


def test_partial_temp_file_is_ignored(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 3, {"w": torch.tensor([3.0])}, None)
    # A crash while writing step 4 leaves only a temp file behind.
    (checkpoint_dir(tmp_path) / ".step-000004.pt.abc123.tmp").write_bytes(b"PK\x03\x04junk")
    payload = load_latest_checkpoint(tmp_path)
    assert payload is not None
    assert payload["step"] == 3


def test_corrupt_newest_file_falls_back_with_warning(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 3, {"w": torch.tensor([3.0])}, None)
    newest = save_checkpoint(tmp_path, 4, {"w": torch.tensor([4.0])}, None)
    newest.write_bytes(newest.read_bytes()[:50])  # disk damage after the fact
    with pytest.warns(UserWarning, match="step-000004.pt: unreadable checkpoint"):
        payload = load_latest_checkpoint(tmp_path)
    assert payload is not None
    assert payload["step"] == 3


def test_only_corrupt_files_is_an_error(tmp_path: Path) -> None:
    directory = checkpoint_dir(tmp_path)
    directory.mkdir()
    (directory / "step-000001.pt").write_bytes(b"garbage")
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="no readable checkpoint"):
        load_latest_checkpoint(tmp_path)
    with pytest.raises(ValueError, match=r"step-000001\.pt: unreadable checkpoint"):
        load_checkpoint(directory / "step-000001.pt")


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep_last"):
        save_checkpoint(tmp_path, 1, {}, None, keep_last=0)
    with pytest.raises(ValueError, match="step"):
        save_checkpoint(tmp_path, -1, {}, None)
