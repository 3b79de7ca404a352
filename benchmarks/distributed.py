"""Step and update time of ``turnrl train`` on 1 and 2 torchrun ranks (gloo, one thread each).

Each arm is a real launch, ``python -m torch.distributed.run --standalone
--nproc-per-node N -m turnrl.cli train ...`` on the calculator recipe (the tiny
model) with ``rollout.per_episode_seeds = true``, so every arm trains on the same
episodes; 1 rank is the one-process trainer. Three arms: 1 rank, 2 ranks each holding
the whole model (``train.sharding = "none"``), 2 ranks with the learner sharded by
FSDP2 (``"fsdp2"``: a whole copy gathered after each step samples). The times are the
run's own ``seconds_step`` and ``seconds_update`` metrics (rank 0's clock: a step ends
when the slowest rank's gradients arrived), averaged over the steps after the first.
Arms alternate (1, 2, 2 fsdp2, 1, ...) so that load from other jobs hits all alike.

    .venv/bin/python benchmarks/distributed.py            # writes the section in RESULTS.md
    .venv/bin/python benchmarks/distributed.py --no-write

CUDA: with 2 or more GPUs the same two arms run with ``policy.device = "cuda"``
(NCCL, one GPU per rank); with fewer the script says why it skipped them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from results_file import write_section  # noqa: E402

TITLE = "Learner over torchrun ranks"


def overrides(args: argparse.Namespace, device: str, size: tuple[int, int]) -> list[str]:
    hidden, layers = size
    return [
        f"policy.device={device}",
        f"policy.hidden={hidden}",
        f"policy.layers={layers}",
        f"warm_start.steps={args.warm_steps}",
        "env.n_train_tasks=64",
        "env.n_eval_tasks=2",
        "train.eval_samples=1",
        f"rollout.tasks_per_step={args.tasks}",
        f"rollout.group_size={args.group}",
        "rollout.per_episode_seeds=true",
        f"train.steps={args.steps}",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        "train.log_rollouts_every=0",
        "train.threads=1",
        f"train.minibatch_size={args.minibatch}",
    ]


ARMS = ((1, "none"), (2, "none"), (2, "fsdp2"))
"""(ranks, train.sharding) of each arm."""


def launch(
    arm: tuple[int, str], device: str, size: tuple[int, int], args: argparse.Namespace
) -> dict[str, float]:
    """One run of ``arm``; mean seconds per step after the first."""
    ranks, sharding = arm
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
            "-m",
            "turnrl.cli",
            "train",
            "--config",
            str(ROOT / "examples" / "calculator.toml"),
            *overrides(args, device, size),
            f"train.sharding={sharding}",
            "--run-dir",
            str(run_dir),
            "--quiet",
        ]
        src = str(ROOT / "src")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": src}
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{ranks} ranks ({sharding}) failed:\n{done.stderr[-3000:]}")
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 2]
    return {
        key: statistics.mean(r[f"seconds_{key}"] for r in steps)
        for key in ("step", "update", "sampling")
    }


Runs = dict[tuple[int, str], list[dict[str, float]]]


def measure(device: str, size: tuple[int, int], args: argparse.Namespace) -> Runs:
    runs: Runs = {arm: [] for arm in ARMS}
    for _ in range(args.repeats):
        for arm in runs:
            runs[arm].append(launch(arm, device, size, args))
            print(f"{device} {size} {arm}: {runs[arm][-1]}", flush=True)
    return runs


def table(runs: Runs) -> list[str]:
    """Means over the runs of each arm; the step time of every run in brackets (noise);
    speed-ups against the 1-rank arm of the same invocation."""
    results = {a: {k: statistics.mean(r[k] for r in rs) for k in rs[0]} for a, rs in runs.items()}
    one = results[ARMS[0]]
    lines = [
        "| ranks | sharding | s/step (each run) | update s/step | sampling s/step "
        "| step speed-up | update speed-up |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for (ranks, sharding), row in results.items():
        each = ", ".join(f"{r['step']:.2f}" for r in runs[(ranks, sharding)])
        lines.append(
            f"| {ranks} | {sharding} | {row['step']:.2f} ({each}) | {row['update']:.2f} | "
            f"{row['sampling']:.2f} | {one['step'] / row['step']:.2f}x | "
            f"{one['update'] / row['update']:.2f}x |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=8, help="tasks per step (even)")
    parser.add_argument("--group", type=int, default=4, help="episodes per task")
    parser.add_argument("--minibatch", type=int, default=16, help="rows per optimiser step")
    parser.add_argument("--warm-steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2, help="runs per arm (alternating)")
    parser.add_argument(
        "--sizes",
        default="64x2,256x4",
        help="tiny-model sizes to measure, hidden x layers (the recipe's is 64x2)",
    )
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    load = os.getloadavg()[0]
    lines = [
        f"Calculator recipe, tiny model, {args.tasks} tasks x {args.group} episodes per step, "
        f"mini-batches of {args.minibatch} rows, {args.warm_steps} warm-start steps; "
        f"{args.steps} steps per run, mean over steps 2-{args.steps}, mean of {args.repeats} "
        "alternating runs per arm; one torch thread per rank; "
        f"1-min load average {load:.1f} at start. 1 rank = the one-process trainer; "
        "sharding fsdp2 = the learner sharded over the ranks by FSDP2, a whole copy "
        "gathered once per step samples.",
        "",
    ]
    for size in sizes:
        name = f"hidden {size[0]}, {size[1]} layers"
        lines += [f"CPU, gloo, {name}:", "", *table(measure("cpu", size, args)), ""]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= 2:
        for size in sizes:
            name = f"hidden {size[0]}, {size[1]} layers"
            lines += [f"CUDA, NCCL (one GPU per rank), {name}:", ""]
            lines += [*table(measure("cuda", size, args)), ""]
    else:
        lines.append(f"CUDA, NCCL: skipped: needs 2 GPUs (one per rank), this machine has {gpus}.")
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        arguments = " ".join(sys.argv[1:])
        command = (
            f".venv/bin/python benchmarks/distributed.py {arguments}"
            if arguments
            else "make bench-distributed  # .venv/bin/python benchmarks/distributed.py"
        )
        write_section(ROOT / "benchmarks" / "RESULTS.md", TITLE, body, command, date.today())


if __name__ == "__main__":
    main()
