"""The peer ratio on SmolLM2: a multi-turn RL step of turnrl against TRL's GRPOTrainer.

Both do the same work on SmolLM2-135M-Instruct (the converted ``smollm2`` directory,
float32, the whole model trained, CPU): ``--prompts`` calculator tasks x
``--generations`` episodes of up to ``--turns`` turns, at most 24 new tokens a turn,
temperature 1, one optimiser step on all of a step's turns, one torch thread.

* TRL: ``benchmarks/trl_step.py --turns N`` in the TRL venv (``.venv-agl``): TRL 1.16's
  ``GRPOTrainer`` with multi-turn episodes through turnrl's adapter (TRL's own loop
  samples with the model it trains), its defaults otherwise (gradient checkpointing on).
* turnrl: ``OnlineTrainer`` on the ``calculator_smollm2`` recipe set to the same work
  (``lora_rank=0``, the calculator's default tool format, ``grpo``), sampling with
  ``--backend`` (this script runs in that backend's venv: ``.venv-vllm`` for ``vllm``).

Each side times ``--steps`` steps after one warm-up step (wall and CPU seconds of the
process; CPU includes every thread's, the vLLM engine's too). Run alone: it is heavy.

    .venv-vllm/bin/python benchmarks/trl_peer.py --model DIR --backend vllm \\
        --trl-python .venv-agl/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from results_file import write_section  # noqa: E402

RECIPE = ROOT / "examples" / "calculator_smollm2.toml"
TITLE = "Multi-turn step on SmolLM2 against TRL's GRPOTrainer"
MAX_NEW_TOKENS = 24
"""trl_step.py's per-turn budget."""


def turnrl_steps(args: argparse.Namespace, work: Path) -> dict[str, float]:
    """Mean wall and CPU seconds of turnrl's step (and its parts) after one warm-up."""
    from turnrl.policy.factory import close_sampler
    from turnrl.train.config import RunConfig, load_config
    from turnrl.train.lifecycle import Lifecycle
    from turnrl.train.online.trainer import OnlineTrainer

    overrides = [
        f"run_dir={work / 'turnrl'}", f"policy.model={args.model}", "policy.lora_rank=0",
        f"policy.backend={args.backend}", f"policy.max_new_tokens={MAX_NEW_TOKENS}",
        f"env.env_kwargs={{max_turns = {args.turns}, turn_cost = 0.0}}",
        f"rollout.tasks_per_step={args.prompts}", f"rollout.group_size={args.generations}",
        "warm_start.steps=0", "train.minibatch_size=100000", "train.epochs=1",
        "train.eval_every=0", "train.checkpoint_every=0", "train.threads=1",
        f"train.steps={args.steps + 1}",
    ]  # fmt: skip
    trainer = OnlineTrainer(load_config(RunConfig, RECIPE, overrides), quiet=True)
    Lifecycle(trainer).start()
    times = []
    try:
        for step in range(args.steps + 1):
            cpu, wall = time.process_time(), time.perf_counter()
            row = trainer.train_step()
            measured = {"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall}
            if step > 0:
                parts = {f"{k}_wall": row[f"seconds_{k}"] for k in ("sampling", "update")}
                times.append({**measured, **parts, "turns": row.get("turns", 0.0)})
    finally:
        close_sampler(trainer.policy, trainer.rollout_policy)
    return {k: statistics.mean(t[k] for t in times) for k in times[0]}


def trl_steps(args: argparse.Namespace, work: Path) -> dict[str, float]:
    """TRL's step in its venv (a child process): mean wall and CPU seconds."""
    out = work / "trl.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRL_EXPERIMENTAL_SILENCE": "1"}
    command = [
        args.trl_python, str(ROOT / "benchmarks" / "trl_step.py"), "--policy", args.model,
        "--turns", str(args.turns), "--steps", str(args.steps), "--out", str(out),
        "--work", str(work / "trl"), "--prompts", str(args.prompts),
        "--generations", str(args.generations),
    ]  # fmt: skip
    subprocess.run(command, check=True, env=env, cwd=ROOT)
    return json.loads(out.read_text())


def table(args: argparse.Namespace, ours: dict[str, float], theirs: dict[str, float]) -> str:
    return "\n".join(
        [
            f"`{Path(args.model).name}` (float32, whole model trained), {args.prompts} tasks x "
            f"{args.generations} episodes of up to {args.turns} turns, at most "
            f"{MAX_NEW_TOKENS} new tokens a turn, one optimiser step, 1 torch thread; "
            f"mean of {args.steps} step(s) after a warm-up; turnrl samples with "
            f"`{args.backend}`. Load while measured: {args.load}.",
            "",
            "| | wall s per step | CPU s per step | sampling wall s | update wall s |",
            "|---|---:|---:|---:|---:|",
            f"| turnrl ({args.backend}) | {ours['wall']:.1f} | {ours['cpu']:.1f} | "
            f"{ours['sampling_wall']:.1f} | {ours['update_wall']:.1f} |",
            f"| TRL GRPOTrainer | {theirs['wall']:.1f} | {theirs['cpu']:.1f} | | |",
            "",
            f"turnrl / TRL: {ours['wall'] / theirs['wall']:.2f}x wall, "
            f"{ours['cpu'] / theirs['cpu']:.2f}x CPU (turnrl's episodes averaged "
            f"{ours['turns']:.2f} turns).",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the converted SmolLM2 directory")
    parser.add_argument("--backend", default="vllm", choices=["hf", "vllm"])
    parser.add_argument("--trl-python", default=str(ROOT / ".venv-agl" / "bin" / "python"))
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1, help="timed steps after a warm-up")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.load = "load average " + ", ".join(f"{x:.1f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="turnrl-trl-peer-") as tmp:
        work = Path(tmp)
        ours = turnrl_steps(args, work)
        theirs = trl_steps(args, work)
    body = table(args, ours, theirs)
    print(body)
    if not args.no_write:
        command = "make bench-trl-peer  # " + " ".join(["benchmarks/trl_peer.py", *sys.argv[1:]])
        write_section(ROOT / "benchmarks" / "RESULTS.md", TITLE, body, command, date.today())


if __name__ == "__main__":
    main()
