"""``make gpu-check``: the checks that need a CUDA GPU, one prepared script, one results file.

    .venv/bin/python benchmarks/gpu_check.py                 # runs/gpu-check/results.{json,md}
    .venv/bin/python benchmarks/gpu_check.py --out DIR --budget-s 540

Without a CUDA device it prints one line, ``gpu-check: no CUDA device; skipped``, and
exits 0. With one, it runs these steps in turn, each a child process with its own
time limit (all of them within ``--budget-s``, about ten minutes on one H200), and
writes every step's command, exit status, seconds and output tail to
``results.json`` and ``results.md`` in ``--out``:

1. ``vllm``: two training steps of the tiny calculator recipe with
   ``policy.backend = "vllm"`` (sampling in an in-process vLLM engine, weights pushed
   after each update), in ``.venv-vllm`` (skipped, and said so, when that venv is
   missing);
2. ``nccl``: two torchrun ranks (NCCL) training the tiny recipe for two steps, when
   two or more GPUs are visible (skipped with one);
3. ``bf16-mixed``: three training steps of the SmolLM2 LoRA recipe on the GPU with
   ``train.precision = "bf16-mixed"`` and with ``fp32``, their update seconds and
   losses side by side (:func:`precision_summary`);
4. ``memory``: benchmarks/memory.py at its ``--quick`` sizes (2k and 8k tokens, every
   arm), which on CUDA also reports the device's peak memory per update.

A failing step does not stop the others; the script exits 1 when any step failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SKIPPED_LINE = "gpu-check: no CUDA device; skipped"

TINY_STEPS = (
    "warm_start.steps=4",
    "warm_start.batch_size=8",
    "env.n_train_tasks=16",
    "env.n_eval_tasks=4",
    "rollout.group_size=2",
    "rollout.tasks_per_step=2",
    "policy.max_new_tokens=12",
    "policy.heads=2",
    "train.steps=2",
    "train.eval_every=0",
    "train.checkpoint_every=0",
    "policy.device=cuda",
)
"""A two-step tiny ``turnrl train`` on the GPU (2 heads of 32: vLLM's attention takes them)."""

SMOL_STEPS = (
    "warm_start.steps=4",
    "rollout.tasks_per_step=4",
    "train.steps=3",
    "train.eval_every=0",
    "train.checkpoint_every=0",
    "policy.device=cuda",
)
"""Three SmolLM2 LoRA training steps (the recipe's sizes otherwise)."""


@dataclass
class Step:
    """One check: a command line run in the repository root, or a reason it is skipped."""

    name: str
    command: list[str]
    timeout_s: float
    skipped: str = ""
    env: dict[str, str] = field(default_factory=dict)


def turnrl_train(python: str, recipe: str, run_dir: Path, overrides: tuple[str, ...]) -> list[str]:
    return [
        python,
        "-m",
        "turnrl.cli",
        "train",
        "--config",
        f"examples/{recipe}.toml",
        "--run-dir",
        str(run_dir),
        "--overwrite",
        *overrides,
    ]


def plan(
    gpus: int, out: Path, *, python: str = sys.executable, budget_s: float = 540
) -> list[Step]:
    """The steps for a machine with ``gpus`` CUDA devices; their time limits share
    ``budget_s`` (vLLM 30 %, NCCL 10 %, bf16-mixed and fp32 10 % each, memory 40 %)."""
    vllm_python = ROOT / ".venv-vllm" / "bin" / "python"
    steps = [
        Step(
            "vllm",
            turnrl_train(
                str(vllm_python), "calculator", out / "vllm", (*TINY_STEPS, "policy.backend=vllm")
            ),
            0.30 * budget_s,
            "" if vllm_python.exists() else f"{vllm_python} missing (make setup-vllm)",
        ),
        Step(
            "nccl",
            [
                python,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "2",
                *turnrl_train(
                    python,
                    "calculator",
                    out / "nccl",
                    (*TINY_STEPS, "rollout.per_episode_seeds=true", "rollout.strategy=independent"),
                )[1:],
            ],
            0.10 * budget_s,
            "" if gpus >= 2 else f"{gpus} CUDA device(s): two ranks need two",
        ),
    ]
    for precision in ("bf16-mixed", "fp32"):
        steps.append(
            Step(
                f"{precision}",
                turnrl_train(
                    python,
                    "calculator_smollm2",
                    out / precision,
                    (*SMOL_STEPS, f"train.precision={precision}"),
                ),
                0.10 * budget_s,
            )
        )
    steps.append(
        Step(
            "memory",
            [
                python,
                "benchmarks/memory.py",
                "--quick",
                "--results",
                str(out / "memory.jsonl"),
                "--timeout",
                str(int(0.1 * budget_s)),
            ],
            0.40 * budget_s,
        )
    )
    return steps


def run_step(step: Step) -> dict[str, Any]:
    """Run one step (or record why not): exit status, seconds, the output's tail."""
    if step.skipped:
        return {"name": step.name, "skipped": step.skipped}
    started = time.perf_counter()
    try:
        done = subprocess.run(
            step.command,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **step.env},
            capture_output=True,
            text=True,
            timeout=step.timeout_s,
        )
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as err:
        code = 124
        output = f"{err.stdout or ''}{err.stderr or ''}\n(over {step.timeout_s:.0f} s)"
        output = output if isinstance(output, str) else str(output)
    return {
        "name": step.name,
        "command": " ".join(step.command),
        "returncode": code,
        "seconds": round(time.perf_counter() - started, 1),
        "tail": output[-2000:],
    }


def precision_summary(out: Path) -> dict[str, Any]:
    """Mean update seconds and last loss of the ``bf16-mixed`` and ``fp32`` runs."""
    summary = {}
    for precision in ("bf16-mixed", "fp32"):
        path = out / precision / "metrics.jsonl"
        if not path.exists():
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        steps = [r for r in rows if "seconds_update" in r]
        if steps:
            summary[precision] = {
                "seconds_update": sum(r["seconds_update"] for r in steps) / len(steps),
                "loss": steps[-1].get("loss"),
                "cuda_peak_mib": max(r.get("update_cuda_peak_mib", 0.0) for r in steps),
            }
    return summary


def markdown(results: list[dict[str, Any]], extra: dict[str, Any]) -> str:
    lines = ["# gpu-check", "", "| step | result | seconds |", "|---|---|---|"]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['name']} | skipped: {r['skipped']} | |")
        else:
            verdict = "ok" if r["returncode"] == 0 else f"FAILED (exit {r['returncode']})"
            lines.append(f"| {r['name']} | {verdict} | {r['seconds']} |")
    lines += ["", "```json", json.dumps(extra, indent=2), "```"]
    for r in results:
        if r.get("returncode"):
            lines += ["", f"## {r['name']}: `{r['command']}`", "", "```", r["tail"], "```"]
    return "\n".join(lines) + "\n"


def cuda_devices() -> int:
    """Visible CUDA devices (0 without torch's CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu-check")
    parser.add_argument("--budget-s", type=float, default=540.0, help="all steps together")
    args = parser.parse_args(argv)
    gpus = cuda_devices()
    if gpus == 0:
        print(SKIPPED_LINE)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for step in plan(gpus, args.out, budget_s=args.budget_s):
        result = run_step(step)
        print(json.dumps({k: v for k, v in result.items() if k != "tail"}), flush=True)
        results.append(result)
    extra = {"gpus": gpus, "precision": precision_summary(args.out)}
    memory = args.out / "memory.jsonl"
    if memory.exists():
        extra["memory"] = [json.loads(line) for line in memory.read_text().splitlines()]
    (args.out / "results.json").write_text(json.dumps({"steps": results, **extra}, indent=2))
    (args.out / "results.md").write_text(markdown(results, extra))
    print(f"gpu-check: results in {args.out / 'results.md'}")
    return int(any(r.get("returncode") for r in results))


if __name__ == "__main__":
    sys.exit(main())
