"""Tokens computed by tree rollouts with prefix reuse, against independent sampling.

Run: ``.venv/bin/python benchmarks/tree_tokens.py`` (``--write`` puts the table
into the "## Tree rollouts: tokens" section of ``benchmarks/RESULTS.md``).

For each environment (``frozenlake``, ``calculator``) and seed, one training
step's rollouts of every strategy are collected on the same tasks with the same
tiny policy (random initialisation, or ``--warm-start N`` supervised steps, so
responses are short and realistic), and nothing is learned: ``learn`` is a
no-op that still counts as an update, so RTPO clears its KV cache after every
turn position it updates on, as it must in training. Per strategy it reports the leaves
(trajectories that end the tree), the tokens of all trajectories, the unique
tokens (each shared prefix once: the physical minimum), the tokens the model
computed (prefill plus fed-back tokens, ``HFPolicy.tokens_computed``), and
computed tokens per leaf relative to ``independent`` without a cache (today's
sampling, which re-encodes every context at every turn).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from datetime import date
from pathlib import Path

import numpy as np
import torch

from turnrl.envs import make_env, make_tasks
from turnrl.policy import build_tiny_policy
from turnrl.rollout import StrategyContext, get_strategy
from turnrl.train.update.sft import demonstration_examples, supervised_warm_start

sys.path.insert(0, str(Path(__file__).parent))
from results_file import RESULTS, write_section

TITLE = "Tree rollouts: tokens"
ENV_KWARGS = {"frozenlake": {"max_turns": 8}, "calculator": {"max_turns": 4}}
"""Environments as in the examples (FrozenLake 4x4 with 8 turns, calculator with 4)."""


def strategies(group: int) -> list[tuple[str, str, int, dict]]:
    """(label, strategy, group size, params): equal leaves for independent/PATR."""
    return [
        ("independent", "independent", group, {"prefix_cache": False}),
        ("independent + cache", "independent", group, {"prefix_cache": True}),
        ("patr (K=2)", "patr", group, {"interval": 2}),
        ("patr (K=1)", "patr", group, {"interval": 1}),
        ("rtpo (G=3)", "rtpo", 3, {}),
        ("atgrpo (K=4)", "atgrpo", 4, {}),
    ]


def warm_started(env: str, steps: int, seed: int):
    policy = build_tiny_policy(seed)
    if steps:
        tasks = make_tasks(env, 256, seed)
        examples = demonstration_examples(
            policy,
            env,
            tasks,
            seed=seed,
            tool_fraction=0.5,
            easy_tool_fraction=0.0,
            env_kwargs=ENV_KWARGS[env],
        )
        supervised_warm_start(policy, examples, steps=steps, lr=3e-3, batch_size=32, seed=seed)
    policy.model.eval()
    return policy


def measure(env: str, seeds: list[int], tasks_per_step: int, group: int, warm: int) -> list[dict]:
    rows: dict[str, list[dict]] = defaultdict(list)
    for seed in seeds:
        policy = warm_started(env, warm, seed)
        tasks = make_tasks(env, tasks_per_step, seed + 100)
        for label, name, size, params in strategies(group):
            ctx = StrategyContext(
                policy=policy,
                make_env=lambda: make_env(env, **ENV_KWARGS[env]),
                max_new_tokens=24,
                temperature=1.0,
                learn=lambda records: {},
                seed=seed,
                traj_prefix="b-",
            )
            exp = get_strategy(name)(ctx, tasks, size, **params)
            leaves = len({r.traj_id for r in exp.batch.records})
            rows[label].append({**exp.extra, "leaves": leaves})
    out = []
    for label, runs in rows.items():
        mean = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
        out.append({"label": label, **mean})
    base = out[0]["tokens_computed"] / out[0]["leaves"]
    for row in out:
        row["computed_per_leaf"] = row["tokens_computed"] / row["leaves"]
        row["vs_independent"] = row["computed_per_leaf"] / base
        row["computed_over_unique"] = row["tokens_computed"] / row["tokens_unique"]
        minimum = row["tokens_unique"] + row.get("tokens_refresh", 0.0)
        row["computed_over_minimum"] = row["tokens_computed"] / minimum
    return out


def markdown(env: str, rows: list[dict]) -> str:
    lines = [
        f"**{env}**",
        "",
        "| strategy | leaves | tokens (all) | unique | computed | computed / unique "
        "| computed / minimum | computed / leaf | vs independent (per leaf) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['leaves']:.0f} | {r['tokens_all']:,.0f} "
            f"| {r['tokens_unique']:,.0f} | {r['tokens_computed']:,.0f} "
            f"| {r['computed_over_unique']:.3f} | {r['computed_over_minimum']:.3f} "
            f"| {r['computed_per_leaf']:,.0f} "
            f"| {r['vs_independent']:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=8, help="tasks per step")
    parser.add_argument("--group", type=int, default=8, help="leaves per task (independent/PATR)")
    parser.add_argument("--warm-start", type=int, default=0, help="SFT steps before measuring")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tables = []
    for env in ("frozenlake", "calculator"):
        rows = measure(env, list(range(args.seeds)), args.tasks, args.group, args.warm_start)
        tables.append(markdown(env, rows))
        print(tables[-1], "\n", flush=True)
    if args.write:
        command = "python benchmarks/tree_tokens.py " + " ".join(sys.argv[1:])
        body = (
            f"- setup: {args.tasks} tasks per step, {args.seeds} seeds (means), tiny policy "
            f"({'random init' if not args.warm_start else f'{args.warm_start} SFT steps'}), "
            "temperature 1, 24 new tokens at most; ratios of the means; no update, but RTPO "
            "still clears its cache after every turn position it would update on (tied ones "
            "are skipped)\n"
            "- leaves: trajectories in the records (RTPO: trunk + siblings; AT-GRPO: main + "
            "unchosen candidates); PATR stops growing at the group size\n"
            "- unique: each shared prefix once (token trie per task); minimum: unique, plus for "
            "RTPO the trunk contexts it must re-encode after each update (`tokens_refresh`)\n\n"
            + "\n\n".join(tables)
        )
        write_section(RESULTS, TITLE, body, command.strip(), date.today())


if __name__ == "__main__":
    main()
