"""The tree-rollout experiment: independent sampling + GRPO vs PATR vs RTPO on FrozenLake.

Recipes ``examples/frozenlake_{independent,patr,rtpo}.toml`` (3x3 maps, tiny
model), one warm start per seed shared by the three strategies, and the SAME
budget of environment steps for every run: a run stops at the first step that
reaches ``--budget`` steps actually taken in environments (copies of shared
tree prefixes are not steps; the trainer's own ``env_steps`` column counts them,
so this script logs ``env_steps_physical``). Evaluation (held-out maps, 2
samples at temperature 0.7) runs every ``--eval-every`` environment steps.

    python examples/tree/run.py --out runs/tree/lr3e-4            # the recipes (lr 3e-4)
    python examples/tree/run.py --out runs/tree/lr1e-3 --lr 1e-3  # every strategy at 1e-3
    python examples/tree/run.py --quick --out /tmp/tree            # 1 seed, tiny budget

Runs go to ``OUT/<strategy>/seed<k>`` (warm starts to ``OUT/../warm``, shared
by every ``OUT``); the HTML report (``turnrl report``) to ``OUT/report.html``;
eval success against environment steps and against tokens computed to
``OUT/curves.png``; a markdown summary to ``OUT/summary.md``. Runs execute one
after the other with one torch thread (the machine is shared); a finished run
is skipped when rerun.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
STRATEGIES = ("independent", "patr", "rtpo")


def recipe(strategy: str) -> Path:
    return ROOT / "examples" / f"frozenlake_{strategy}.toml"


def load(strategy: str, overrides: list[str]):
    from turnrl.train.config import RunConfig, load_config

    return load_config(RunConfig, recipe(strategy), [*overrides, "train.threads=1"])


def warm_start(root: Path, seed: int, overrides: list[str]) -> Path:
    """One warm start per seed (the independent recipe's, identical in all three)."""
    from turnrl.train.online import OnlineTrainer

    run_dir = root / f"seed{seed}"
    if not (run_dir / "warm_start" / "config.json").exists():
        config = load(
            "independent", [*overrides, f"run_dir={run_dir}", f"train.seed={seed}", "train.steps=0"]
        )
        OnlineTrainer(config, quiet=True).run()
    return run_dir / "warm_start"


def train(strategy: str, seed: int, warm: Path, run_dir: Path, args, overrides) -> None:
    """Train until ``args.budget`` physical environment steps; evaluate on a fixed grid."""
    from turnrl.io import append_jsonl
    from turnrl.train.online import OnlineTrainer

    config = load(
        strategy,
        [
            *overrides,
            f"run_dir={run_dir}",
            f"train.seed={seed}",
            f"warm_start.init_from={warm}",
            "train.steps=100000",  # the budget below ends the run
            "train.checkpoint_every=0",
        ],
    )
    trainer = OnlineTrainer(config, quiet=True)
    trainer.run(stop_after=0)  # set-up (load the warm start) and the step-0 evaluation
    metrics = run_dir / "metrics.jsonl"
    used = computed = 0.0
    next_eval = args.eval_every
    started = time.perf_counter()
    while used < args.budget:
        row = trainer.train_step()
        used += row["rollout_env_steps"]
        computed += row.get("tokens_computed", float("nan"))
        row.update(env_steps_physical=used, tokens_computed_total=computed)
        if used >= next_eval or used >= args.budget:
            row.update(trainer.evaluate())
            next_eval += args.eval_every
        row["seconds_total"] = time.perf_counter() - started
        append_jsonl(metrics, row)
    (run_dir / "done").write_text("ok\n")


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def curves(out: Path, seeds: int) -> dict[str, dict[str, list]]:
    """Per strategy and seed: (env steps, tokens computed, eval success) at each evaluation."""
    data: dict[str, dict[str, list]] = {}
    for strategy in STRATEGIES:
        per_seed = []
        for seed in range(seeds):
            evals = [r for r in rows(out / strategy / f"seed{seed}") if "eval_success" in r]
            per_seed.append(
                (
                    [r.get("env_steps_physical", 0.0) for r in evals],
                    [r.get("tokens_computed_total", 0.0) for r in evals],
                    [r["eval_success"] for r in evals],
                )
            )
        data[strategy] = {"runs": per_seed}
    return data


def plot(out: Path, data: dict) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for (strategy, entry), color in zip(data.items(), ("C0", "C1", "C2"), strict=False):
        runs = entry["runs"]
        n = min(len(r[2]) for r in runs)
        for axis, which, label in ((0, 0, "environment steps"), (1, 1, "tokens computed")):
            ax = axes[axis]
            for run in runs:
                ax.plot(run[which], run[2], color=color, alpha=0.25, lw=1)
            x = np.mean([r[which][:n] for r in runs], axis=0)
            y = np.array([r[2][:n] for r in runs])
            ax.plot(x, y.mean(0), color=color, lw=2, label=f"{strategy} ({len(runs)} seeds)")
            ax.fill_between(x, y.mean(0) - y.std(0), y.mean(0) + y.std(0), color=color, alpha=0.1)
            ax.set_xlabel(label)
            ax.set_ylabel("eval success (held-out maps)")
    axes[0].legend()
    fig.suptitle("FrozenLake 3x3: eval success vs environment steps and vs tokens computed")
    fig.tight_layout()
    path = out / "curves.png"
    fig.savefig(path, dpi=110)
    return path


def summary(out: Path, seeds: int) -> str:
    lines = [
        "| strategy | eval success: start | end (mean ± std) | env steps | tokens computed "
        "| computed / env step | updates | minutes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for strategy in STRATEGIES:
        start, end, steps, tokens, updates, minutes = [], [], [], [], [], []
        for seed in range(seeds):
            run = rows(out / strategy / f"seed{seed}")
            evals = [r for r in run if "eval_success" in r]
            start.append(evals[0]["eval_success"])
            end.append(evals[-1]["eval_success"])
            steps.append(run[-1]["env_steps_physical"])
            tokens.append(run[-1]["tokens_computed_total"])
            updates.append(sum(r.get("updates", 1.0) for r in run[1:]))
            minutes.append(run[-1]["seconds_total"] / 60)
        lines.append(
            f"| {strategy} | {np.mean(start):.3f} | {np.mean(end):.3f} ± {np.std(end):.3f} "
            f"| {np.mean(steps):,.0f} | {np.mean(tokens):,.0f} "
            f"| {np.sum(tokens) / np.sum(steps):.0f} | {np.mean(updates):.0f} "
            f"| {np.mean(minutes):.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=6000, help="environment steps per run")
    parser.add_argument("--eval-every", type=float, default=1000, help="in environment steps")
    parser.add_argument("--out", default=str(ROOT / "runs" / "tree"))
    parser.add_argument("--lr", type=float, default=None, help="override every recipe's lr")
    parser.add_argument(
        "--warm", default=None, help="warm starts' directory (default: OUT/../warm, shared)"
    )
    parser.add_argument("--quick", action="store_true", help="1 seed, 300 steps, tiny warm start")
    args = parser.parse_args()
    overrides: list[str] = []
    if args.quick:
        args.seeds, args.budget, args.eval_every = 1, 300, 150
        overrides = ["warm_start.steps=10", "env.n_eval_tasks=4", "rollout.tasks_per_step=2"]
    if args.lr is not None:
        overrides.append(f"train.lr={args.lr}")
    out = Path(args.out)
    warm_root = Path(args.warm) if args.warm else out.parent / "warm"
    for seed in range(args.seeds):
        warm = warm_start(warm_root, seed, [o for o in overrides if not o.startswith("train.lr")])
        for strategy in STRATEGIES:
            run_dir = out / strategy / f"seed{seed}"
            if (run_dir / "done").exists():
                continue
            print(f"{strategy} seed {seed} ...", flush=True)
            train(strategy, seed, warm, run_dir, args, overrides)

    from turnrl.report import write_report

    run_dirs = [out / s / f"seed{k}" for s in STRATEGIES for k in range(args.seeds)]
    report = write_report(run_dirs, out / "report.html", title="Tree rollouts on FrozenLake")
    figure = plot(out, curves(out, args.seeds))
    table = summary(out, args.seeds)
    (out / "summary.md").write_text(table + "\n")
    print(table, f"\nreport: {report}\ncurves: {figure}", sep="\n")


if __name__ == "__main__":
    main()
