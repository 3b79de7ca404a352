"""benchmarks/gpu_check.py (``make gpu-check``) where no GPU is: the one skipped line and
exit 0, the plan it would run (steps skipped with their reason, time limits within the
budget, configs that validate), and its runner and results files on small real
commands."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from conftest import REPO
from turnrl.config_toml import load_config
from turnrl.train.config import RunConfig
from turnrl.train.validate import validate

_spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
assert _spec is not None and _spec.loader is not None
gpu_check = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gpu_check  # its dataclass looks its module up there
_spec.loader.exec_module(gpu_check)


def test_without_cuda_one_line_and_exit_0(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setattr(gpu_check, "cuda_devices", lambda: 0)
    assert gpu_check.main(["--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out == "gpu-check: no CUDA device; skipped\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("gpus", [1, 2])
def test_plan_skips_what_the_machine_lacks_within_the_budget(gpus, tmp_path) -> None:
    steps = {s.name: s for s in gpu_check.plan(gpus, tmp_path, python="py", budget_s=600)}
    assert list(steps) == ["vllm", "nccl", "bf16-mixed", "fp32", "memory"]
    assert sum(s.timeout_s for s in steps.values()) <= 600
    assert bool(steps["nccl"].skipped) == (gpus < 2)
    assert steps["nccl"].command[:3] == ["py", "-m", "torch.distributed.run"]
    assert "--nproc-per-node" in steps["nccl"].command
    vllm_python = REPO / ".venv-vllm" / "bin" / "python"
    assert bool(steps["vllm"].skipped) == (not vllm_python.exists())
    assert steps["vllm"].command[0] == str(vllm_python)
    assert "train.precision=bf16-mixed" in steps["bf16-mixed"].command
    assert steps["memory"].command[1:3] == ["benchmarks/memory.py", "--quick"]


@pytest.mark.parametrize(
    ("recipe", "overrides"),
    [
        ("calculator", (*gpu_check.TINY_STEPS, "policy.backend=hf")),
        ("calculator", (*gpu_check.TINY_STEPS, "rollout.per_episode_seeds=true")),
        ("calculator_smollm2", (*gpu_check.SMOL_STEPS, "train.precision=bf16-mixed")),
    ],
)
def test_the_planned_runs_are_valid_configs(recipe, overrides, tmp_path) -> None:
    # the same overrides on the CPU (this machine has no CUDA to validate cuda against)
    cpu = [o if o != "policy.device=cuda" else "policy.device=cpu" for o in overrides]
    cpu.append(f"run_dir={tmp_path}")
    validate(load_config(RunConfig, REPO / "examples" / f"{recipe}.toml", cpu), overrides=cpu)


def test_run_step_reports_success_failure_timeout_and_skip() -> None:
    ok = gpu_check.run_step(gpu_check.Step("ok", [sys.executable, "-c", "print('hi')"], 60))
    assert ok["returncode"] == 0 and ok["tail"] == "hi\n" and ok["seconds"] >= 0
    bad = gpu_check.run_step(
        gpu_check.Step("bad", [sys.executable, "-c", "import sys; sys.exit(3)"], 60)
    )
    assert bad["returncode"] == 3
    slow = gpu_check.run_step(
        gpu_check.Step("slow", [sys.executable, "-c", "import time; time.sleep(30)"], 0.5)
    )
    assert slow["returncode"] == 124 and "over 0 s" in slow["tail"]
    assert gpu_check.run_step(gpu_check.Step("x", ["false"], 1, skipped="why")) == {
        "name": "x",
        "skipped": "why",
    }


def test_main_writes_one_results_file_and_exits_1_on_a_failed_step(
    monkeypatch, capsys, tmp_path
) -> None:
    def fake_plan(gpus, out, **_):
        (out / "bf16-mixed").mkdir()
        rows = [{"step": 1, "seconds_update": 2.0, "loss": 0.5}, {"step": 2, "seconds_update": 4.0}]
        (out / "bf16-mixed" / "metrics.jsonl").write_text(
            "\n".join(json.dumps(r) for r in [{"step": 0}, *rows]) + "\n"
        )
        return [
            gpu_check.Step("fine", [sys.executable, "-c", "print(1)"], 60),
            gpu_check.Step("broken", [sys.executable, "-c", "raise SystemExit(2)"], 60),
            gpu_check.Step("nccl", [], 1, skipped="1 CUDA device(s): two ranks need two"),
        ]

    monkeypatch.setattr(gpu_check, "cuda_devices", lambda: 1)
    monkeypatch.setattr(gpu_check, "plan", fake_plan)
    assert gpu_check.main(["--out", str(tmp_path)]) == 1
    results = json.loads((tmp_path / "results.json").read_text())
    assert [s["name"] for s in results["steps"]] == ["fine", "broken", "nccl"]
    assert results["gpus"] == 1
    # the last step's loss is None: the mean of update seconds, the last step's loss
    assert results["precision"] == {
        "bf16-mixed": {"seconds_update": 3.0, "loss": None, "cuda_peak_mib": 0.0}
    }
    markdown = (tmp_path / "results.md").read_text()
    assert "| fine | ok |" in markdown and "| broken | FAILED (exit 2) |" in markdown
    assert "| nccl | skipped: 1 CUDA device(s): two ranks need two | |" in markdown
    assert capsys.readouterr().out.endswith(f"results in {tmp_path / 'results.md'}\n")
