"""Rollout throughput: the batched runner against one episode at a time, same model, same run.

Also measures the cost split of a training step (sampling, environment, credit,
update) from a short real training run.

    .venv/bin/python benchmarks/rollout.py            # writes the section in RESULTS.md
    .venv/bin/python benchmarks/rollout.py --no-write

The policy is the tiny character-level Qwen2 after a short warm start (so that
responses end with the end-of-turn token as in training, instead of running to
``max_new_tokens`` as a random model does).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from results_file import write_section  # noqa: E402

from turnrl.envs import make_env, make_tasks  # noqa: E402
from turnrl.policy import build_tiny_policy  # noqa: E402
from turnrl.rollout import run_episodes  # noqa: E402
from turnrl.train.config import RunConfig, load_config  # noqa: E402
from turnrl.train.lifecycle import Lifecycle  # noqa: E402
from turnrl.train.online.trainer import OnlineTrainer  # noqa: E402
from turnrl.train.update.sft import demonstration_examples, supervised_warm_start  # noqa: E402


def warm_policy(steps: int):
    policy = build_tiny_policy(0)
    tasks = make_tasks("calculator", 512, seed=0)
    examples = demonstration_examples(
        policy, "calculator", tasks, seed=0, tool_fraction=0.5, easy_tool_fraction=0.0
    )
    supervised_warm_start(policy, examples, steps=steps, lr=3e-3, batch_size=32, seed=0)
    return policy


def measure(policy, tasks, group_size: int, batched: bool, seed: int) -> tuple[float, int, int]:
    """Seconds, sampled tokens and episodes for all tasks x group_size episodes."""
    started = time.perf_counter()
    tokens = episodes = 0
    if batched:
        batch = run_episodes(
            policy,
            lambda: make_env("calculator"),
            tasks,
            group_size=group_size,
            max_new_tokens=24,
            temperature=1.0,
            seed=seed,
        )
        tokens, episodes = batch.sampled_tokens, len(batch.episodes)
    else:
        for i, task in enumerate(tasks):
            for g in range(group_size):
                batch = run_episodes(
                    policy,
                    lambda: make_env("calculator"),
                    [task],
                    group_size=1,
                    max_new_tokens=24,
                    temperature=1.0,
                    seed=seed + 1000 * i + g,
                )
                tokens += batch.sampled_tokens
                episodes += 1
    return time.perf_counter() - started, tokens, episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warm-steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    policy = warm_policy(args.warm_steps)
    tasks = make_tasks("calculator", args.tasks, seed=123)
    rows = []
    for batched in (False, True):
        runs = [
            measure(policy, tasks, args.group_size, batched, seed=r) for r in range(args.repeats)
        ]
        seconds = statistics.median(r[0] for r in runs)
        tokens = statistics.median(r[1] for r in runs)
        episodes = runs[0][2]
        rows.append((batched, seconds, tokens / seconds, episodes / seconds))
    base = rows[0]
    lines = [
        f"{args.tasks} calculator tasks x {args.group_size} episodes, tiny model after "
        f"{args.warm_steps} warm-start steps, {args.threads} torch thread(s), median of "
        f"{args.repeats}.",
        "",
        "| runner | seconds | tokens/s | episodes/s | speed-up |",
        "|---|---:|---:|---:|---:|",
    ]
    for batched, seconds, tps, eps in rows:
        name = "batched (all episodes per call)" if batched else "one episode at a time"
        lines.append(
            f"| {name} | {seconds:.2f} | {tps:.0f} | {eps:.1f} | {base[1] / seconds:.1f}x |"
        )

    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(
            RunConfig,
            ROOT / "examples" / "calculator.toml",
            [
                f"run_dir={tmp}",
                "warm_start.steps=50",
                "train.steps=5",
                "train.eval_every=100",
                f"train.threads={args.threads}",
                "train.log_rollouts_every=0",
            ],
        )
        trainer = OnlineTrainer(config, quiet=True)
        Lifecycle(trainer).start()
        trainer.policy.load_state_dict(policy.state_dict())
        steps = [trainer.train_step() for _ in range(config.train.steps)]
    keys = ("seconds_sampling", "seconds_env", "seconds_credit", "seconds_update")
    total = sum(statistics.mean(s[k] for s in steps) for k in keys)
    lines += [
        "",
        f"Cost split of one training step (calculator recipe, {config.rollout.tasks_per_step} "
        f"tasks x {config.rollout.group_size} episodes, mean of {len(steps)} steps):",
        "",
        "| part | seconds | share |",
        "|---|---:|---:|",
    ]
    for key in keys:
        value = statistics.mean(s[key] for s in steps)
        lines.append(f"| {key.removeprefix('seconds_')} | {value:.3f} | {value / total:.0%} |")
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        command = "make bench-rollout  # .venv/bin/python benchmarks/rollout.py"
        write_section(
            ROOT / "benchmarks" / "RESULTS.md", "Rollout throughput", body, command, date.today()
        )


if __name__ == "__main__":
    main()
