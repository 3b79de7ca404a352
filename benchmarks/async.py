"""Synchronous against ``train.max_staleness = 1``: steps per hour, alternating rounds.

Each round trains a calculator recipe twice from the same config, once
synchronous (``K = 0``) and once asynchronous (``K = 1``: a sampler process for a
built-in environment, the next step's agents during the update in the agent loop), the
order flipping every round so drifting machine load hits both alike. A step's time is
its ``seconds_step`` (the trainer's step: sampling, running the agents or waiting for
them, credit and update; the warm start, evaluations and checkpoints are outside it,
alike for both). Steps per hour = steps / summed step seconds. Beside the ratio stands
its bound from the synchronous runs' own phases: ``(sampling + update) / max(sampling,
update)``, what perfect overlap would give; on a machine whose two cores are busy with
other work, the two arms' threads or processes also compete for them.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/async.py --rounds 2 --steps 4
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/async.py --recipe smollm2 --rounds 2 --steps 4
    (--write: the result into benchmarks/RESULTS.md, one section per recipe)

``--recipe tiny`` (default): the tests' tiny recipe, 4 tasks x 4 rollouts per step.
``--recipe smollm2``: ``examples/calculator_smollm2.toml`` (SmolLM2-135M-Instruct, LoRA;
its sampler process is the hf sampler with a merged copy of the weights), with a shorter
warm start (outside the step times) and no evaluations or checkpoints, so that every
step after the first samples ahead.
``--recipe smollm2-vllm``: the same on ``policy.backend = "vllm"`` (run it with
``.venv-vllm/bin/python``, ``TURNRL_SMOLLM2_DIR`` naming the converted model and
``VLLM_CPU_OMP_THREADS_BIND=nobind``, as ``make bench-async`` does): synchronous, the
learner's engine samples between updates; at ``K = 1`` a sampler process runs an engine
of its own. The first step of a ``K = 1`` run includes that engine's start.
``--recipe agent-smollm2``: the agent loop, ``examples/agents/calc_openai_smollm2.toml``
(the openai-client calculator agent, unchanged, on SmolLM2 with LoRA, 4 tasks x 4
rollouts), likewise shortened; at ``K = 1`` each step's agents run during the previous
update against a merged copy of the weights (partial rollouts).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import NamedTuple

import numpy as np
from results_file import RESULTS, write_section

from turnrl.train.agent.asynchronous import agent_trainer
from turnrl.train.config import RunConfig, load_config
from turnrl.train.lifecycle import Lifecycle
from turnrl.train.online.asynchronous import online_trainer

ROOT = Path(__file__).resolve().parents[1]
TINY = (
    "warm_start.steps=6",
    "warm_start.batch_size=8",
    "env.n_train_tasks=64",
    "env.n_eval_tasks=2",
    "rollout.group_size=4",
    "rollout.tasks_per_step=4",
    "policy.max_new_tokens=12",
    "train.eval_every=0",
    "train.checkpoint_every=0",
    "train.minibatch_size=8",
    "train.epochs=2",
    "train.threads=1",
    "train.log_rollouts_every=0",
    "train.tis_cap=2.0",
)
"""The tiny recipe of the tests, a little larger per step (4 tasks x 4 rollouts)."""
SMOLLM2 = (
    "warm_start.steps=8",
    "train.eval_every=0",
    "train.checkpoint_every=0",
    "train.threads=1",
    "train.log_rollouts_every=0",
    "train.tis_cap=2.0",
)
"""The SmolLM2 recipe as it ships (4 tasks x 4 rollouts, LoRA), its warm start halved."""
AGENT_SMOLLM2 = (*SMOLLM2, "tasks.n_eval=2")
"""The agent recipe as it ships (4 tasks x 4 rollouts, LoRA), its warm start halved, its
step-0 evaluation (which every run makes) on 2 tasks."""


class Recipe(NamedTuple):
    """A ``--recipe``: its file, the benchmark's overrides, its RESULTS.md section."""

    path: Path
    overrides: tuple[str, ...]
    title: str
    description: str


RECIPES = {
    "tiny": Recipe(
        ROOT / "examples" / "calculator.toml",
        TINY,
        "Asynchronous sampling (train.max_staleness)",
        "Tiny calculator recipe (4 tasks x 4 rollouts per step, tiny model, one torch "
        "thread per process)",
    ),
    "smollm2": Recipe(
        ROOT / "examples" / "calculator_smollm2.toml",
        SMOLLM2,
        "Asynchronous sampling on SmolLM2 (train.max_staleness)",
        "examples/calculator_smollm2.toml (SmolLM2-135M-Instruct with LoRA, 4 tasks x 4 "
        "rollouts per step, hf sampler process holding a merged copy, one torch thread per "
        "process)",
    ),
    "smollm2-vllm": Recipe(
        ROOT / "examples" / "calculator_smollm2.toml",
        (*SMOLLM2, "policy.backend=vllm"),
        "Asynchronous sampling on SmolLM2 with a vLLM sampler process (train.max_staleness)",
        "examples/calculator_smollm2.toml on vLLM (SmolLM2-135M-Instruct with LoRA, 4 tasks x "
        "4 rollouts per step; synchronous: the learner's in-process engine samples; K = 1: "
        "a spawned sampler process runs its own engine, the learner's engine only evaluates; "
        "one torch thread per process, engines compiled, not pinned)",
    ),
    "agent-smollm2": Recipe(
        ROOT / "examples" / "agents" / "calc_openai_smollm2.toml",
        AGENT_SMOLLM2,
        "Partial rollouts in the agent loop on SmolLM2 (train.max_staleness)",
        "examples/agents/calc_openai_smollm2.toml (the openai-client agent through the "
        "gateway, SmolLM2-135M-Instruct with LoRA, 4 tasks x 4 rollouts per step; at K = 1 "
        "the next step's agents run during the update against a merged copy that samples "
        "in a process of its own; one torch thread per process)",
    ),
}


def run_arm(root: Path, name: str, recipe: str, steps: int, staleness: int) -> list[dict]:
    """One run of ``recipe``; its metrics rows after step 0."""
    chosen = RECIPES[recipe]
    overrides = [*chosen.overrides, f"train.steps={steps}", f"train.max_staleness={staleness}"]
    config = load_config(RunConfig, chosen.path, [*overrides, f"run_dir={root / name}"])
    trainer = agent_trainer if config.agent.enabled else online_trainer
    Lifecycle(trainer(config, quiet=True)).run()
    rows = [json.loads(line) for line in (root / name / "metrics.jsonl").read_text().splitlines()]
    return rows[1:]


def summary(rounds: list[dict[str, list[dict]]], steps: int) -> str:
    """The result as a markdown table and its lines."""
    lines = [
        "| round | sync steps/h | K=1 steps/h | ratio | bound (sync phases) "
        "| sync episodes/s | K=1 episodes/s | K=1 staleness mean | K=1 learner idle s/step |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios, bounds = [], []
    for i, arms in enumerate(rounds, 1):
        sync, fast = arms["sync"], arms["k1"]
        rate = {k: steps / sum(r["seconds_step"] for r in rows) * 3600 for k, rows in arms.items()}
        episodes = {  # finished episodes (agent loop: rollouts that did not fail) per second
            k: sum(r["episodes"] for r in rows) / sum(r["seconds_step"] for r in rows)
            for k, rows in arms.items()
        }
        phase = "seconds_agents" if "seconds_agents" in sync[0] else "seconds_sampling"
        sampling = float(np.mean([r[phase] for r in sync]))
        update = float(np.mean([r["seconds_update"] for r in sync]))
        bound = (sampling + update) / max(sampling, update)
        ratio = rate["k1"] / rate["sync"]
        ratios.append(ratio)
        bounds.append(bound)
        staleness = float(np.mean([r["staleness_mean"] for r in fast]))
        idle = float(np.mean([r["seconds_learner_idle"] for r in fast]))
        lines.append(
            f"| {i} | {rate['sync']:,.0f} | {rate['k1']:,.0f} | {ratio:.2f}x | {bound:.2f}x "
            f"(sampling {sampling:.2f} s + update {update:.2f} s) | {episodes['sync']:.2f} "
            f"| {episodes['k1']:.2f} | {staleness:.2f} | {idle:.2f} |"
        )
    lines += [
        "",
        f"Mean ratio {np.mean(ratios):.2f}x against a mean bound of {np.mean(bounds):.2f}x "
        f"({len(rounds)} rounds of {steps} steps per arm).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="tiny")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--write", action="store_true", help="into benchmarks/RESULTS.md")
    args = parser.parse_args()
    started = time.perf_counter()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        for i in range(args.rounds):
            order = [("sync", 0), ("k1", 1)]
            if i % 2:
                order.reverse()
            arms = {}
            for name, k in order:
                arms[name] = run_arm(Path(tmp), f"{name}-{i}", args.recipe, args.steps, k)
                print(f"round {i + 1}: {name} done ({time.perf_counter() - started:.0f} s)")
            rounds.append(arms)
    table = summary(rounds, args.steps)
    print(table)
    print(f"({time.perf_counter() - started:.0f} s of wall time)")
    if args.write:
        recipe = "" if args.recipe == "tiny" else f"--recipe {args.recipe} "
        python = "OMP_NUM_THREADS=1 .venv/bin/python"
        if args.recipe.endswith("vllm"):
            python = (
                "TURNRL_SMOLLM2_DIR=<the converted SmolLM2> VLLM_CPU_OMP_THREADS_BIND=nobind "
                "OMP_NUM_THREADS=1 .venv-vllm/bin/python"
            )
        command = (
            f"{python} benchmarks/async.py "
            f"{recipe}--rounds {args.rounds} --steps {args.steps} --write"
        )
        body = (
            f"{RECIPES[args.recipe].description}, synchronous against `train.max_staleness=1` "
            "(docs/async.md), alternating order per round; steps/h from the summed "
            "`seconds_step`.\n\n" + table
        )
        write_section(RESULTS, RECIPES[args.recipe].title, body, command, date.today())


if __name__ == "__main__":
    main()
