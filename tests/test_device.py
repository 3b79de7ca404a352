"""``policy.device`` and ``policy.dtype``: names, clear errors, lower precision end to end,
and a CUDA smoke test (marked ``gpu``, skipped where torch sees no GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from builders import one_turn_records
from turnrl.cli import main
from turnrl.policy.device import resolve_device, resolve_dtype
from turnrl.serve import cli as serve_cli
from turnrl.table import TurnTable
from turnrl.train.config import PolicyConfig, RunConfig, load_config
from turnrl.train.run import build_policy
from turnrl.train.update.ppo import PPOConfig, build_update_batch, ppo_update
from turnrl.train.validate import ConfigError, validate

torch.set_num_threads(1)
HAS_CUDA = torch.cuda.is_available()


def test_device_and_dtype_names() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if HAS_CUDA else "cpu")
    assert resolve_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="device 'tpu': choose one of auto, cpu, cuda"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match="dtype 'fp8': choose one of float32, bfloat16"):
        resolve_dtype("fp8")


@pytest.mark.skipif(HAS_CUDA, reason="checks the error on a machine without a GPU")
def test_cuda_without_a_gpu_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
        resolve_device("cuda")
    config = load_config(RunConfig, None, ["policy.device=cuda", "policy.dtype=bfloat16"])
    with pytest.raises(ConfigError, match=r"policy\.device"):
        validate(config)
    bad = load_config(RunConfig, None, ["policy.device=gpu"])
    with pytest.raises(ConfigError, match=r"policy\.device.*'gpu'"):
        validate(bad)


def test_dtype_is_a_checked_choice() -> None:
    with pytest.raises(ValueError, match=r"policy\.dtype"):
        load_config(RunConfig, None, ["policy.dtype=float64"])


def test_serve_takes_device_and_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    policy = serve_cli.load_policy("tiny", device="cpu", dtype="bfloat16")
    assert policy.dtype is torch.bfloat16 and policy.device.type == "cpu"
    assert main(["serve", "--port", "0", "--device", "tpu"]) == 2
    assert "--device/--dtype: device 'tpu'" in capsys.readouterr().err


def _one_task_batch(policy):
    contexts = [policy.encode_initial([{"role": "user", "content": f"q{i % 2}"}]) for i in range(4)]
    samples = policy.sample(contexts, max_new_tokens=6, temperature=1.0, seed=0)
    records = one_turn_records(contexts, samples, [f"t{i % 2}" for i in range(4)])
    table = TurnTable.from_records(records)
    return build_update_batch(records, table, np.array([1.0, -1.0, 0.5, -0.5]), None, "token-mean")


def _update_in(device: str, dtype: str) -> tuple[dict[str, float], dict[str, float]]:
    """One tree update and one rows update from the same weights and batch."""
    results = []
    for update in ("tree", "rows"):
        policy = build_policy(PolicyConfig(device=device, dtype=dtype, hidden=32, layers=2), 0)
        assert policy.device.type == torch.device(device).type and policy.dtype == resolve_dtype(
            dtype
        )
        batch = _one_task_batch(policy)
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
        config = PPOConfig(minibatch_size=8, update=update)
        results.append(
            ppo_update(policy, optimizer, batch, config, temperature=1.0, reference=None, seed=0)
        )
    return results[0], results[1]


def test_bfloat16_update_runs_and_agrees_with_rows_on_cpu() -> None:
    tree, rows = _update_in("cpu", "bfloat16")
    assert tree["ratio_mean"] == pytest.approx(1.0, abs=0.05)
    assert tree["loss"] == pytest.approx(rows["loss"], abs=0.05)
    assert tree["update_tokens_computed"] < rows["update_tokens_computed"]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_smoke_sampling_and_tree_update() -> None:
    tree, rows = _update_in("cuda", "float32")
    assert tree["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert tree["loss"] == pytest.approx(rows["loss"], rel=1e-4, abs=1e-6)
    assert tree["grad_norm"] == pytest.approx(rows["grad_norm"], rel=1e-3)
    assert "update_cuda_peak_mib" in tree
    tree16, _ = _update_in("cuda", "bfloat16")
    assert tree16["ratio_mean"] == pytest.approx(1.0, abs=0.05)
