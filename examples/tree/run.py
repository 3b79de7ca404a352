"""The tree-rollout experiment: independent sampling + GRPO vs PATR vs RTPO on FrozenLake.

Recipes ``examples/frozenlake_{independent,patr,rtpo}.toml`` (3x3 maps, tiny
model), one warm start per seed shared by the three strategies, and the SAME
budget of environment steps for every run: a run stops at the first step that
reaches ``--budget`` steps actually taken in environments (copies of shared
tree prefixes are not steps; this script logs them as ``env_steps_physical``,
which the trainer's ``env_steps`` column now equals). Evaluation (held-out maps, 2
samples at temperature 0.7) runs every ``--eval-every`` environment steps.

The study is declared in ``turnrl.study.catalogue`` (``tree-rollouts``: 3 strategies
x 3 seeds x 2 learning rates, one warm start per seed); this script is its cell and
its resource table:

    make study-tree-rollouts                     # all of it, resumable
    turnrl study run tree-rollouts --jobs 2      # runs/studies/tree-rollouts/<lr>/<arm>/seed<k>
    turnrl study summarise tree-rollouts         # success tables (paired, with intervals), figure
    python examples/tree/run.py --summarise --out runs/studies/tree-rollouts/lr3e-4
                                                 # steps, tokens, updates, collapses; report, curves
    python examples/tree/run.py --quick --out /tmp/tree/x   # smoke run: 1 seed, tiny budget

``--cell --config RECIPE OVERRIDES...`` is one cell (what the study runs). The
summary writes ``OUT/summary.md``, ``OUT/report.html`` (``turnrl report``),
``OUT/curves.png`` (eval success against environment steps and tokens computed)
and the table between the doc's ``tree-rollouts-resources:<OUT's name>`` markers.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "runs" / "studies" / "tree-rollouts"
DOC = ROOT / "docs" / "tree-rollouts.md"
STRATEGIES = ("independent", "patr", "rtpo")


def recipe(strategy: str) -> Path:
    return ROOT / "examples" / f"frozenlake_{strategy}.toml"


def load(strategy: str, overrides: list[str]):
    from turnrl.train.config import RunConfig, load_config

    return load_config(RunConfig, recipe(strategy), [*overrides, "train.threads=1"])


def warm_start(root: Path, seed: int, overrides: list[str]) -> Path:
    """One warm start per seed (the independent recipe's, identical in all three)."""
    from turnrl.train.online.trainer import OnlineTrainer

    run_dir = root / f"seed{seed}"
    if not (run_dir / "warm_start" / "config.json").exists():
        config = load(
            "independent", [*overrides, f"run_dir={run_dir}", f"train.seed={seed}", "train.steps=0"]
        )
        OnlineTrainer(config, quiet=True, overwrite=True).run()  # redo an unfinished one
    return run_dir / "warm_start"


def train(strategy: str, seed: int, warm: Path, run_dir: Path, args, overrides) -> None:
    """One run of the old sequential loop (``--quick``): the recipe of ``strategy``."""
    train_cell(
        recipe(strategy),
        [
            *overrides,
            "train.threads=1",
            f"run_dir={run_dir}",
            f"train.seed={seed}",
            f"warm_start.init_from={warm}",
        ],
        args.budget,
        args.eval_every,
    )


def train_cell(config_path: Path, overrides: list[str], budget: float, eval_every: float) -> None:
    """Train until ``budget`` physical environment steps; evaluate on a fixed grid.

    This is one cell of the ``tree-rollouts`` study (``turnrl study run tree-rollouts``
    calls ``run.py --budget B --eval-every E --cell --config RECIPE OVERRIDES...``);
    an unfinished run is redone from its start (``overwrite``)."""
    from turnrl.io import append_jsonl
    from turnrl.train.config import RunConfig, load_config
    from turnrl.train.online.trainer import OnlineTrainer

    config = load_config(
        RunConfig,
        config_path,
        [
            *overrides,
            "train.steps=100000",  # the budget below ends the run
            "train.checkpoint_every=0",
        ],
    )
    run_dir = Path(config.run_dir)
    trainer = OnlineTrainer(config, quiet=True, overwrite=True)  # redo an unfinished run
    trainer.run(stop_after=0)  # set-up (load the warm start) and the step-0 evaluation
    metrics = run_dir / "metrics.jsonl"
    used = computed = 0.0
    next_eval = eval_every
    started = time.perf_counter()
    while used < budget:
        row = trainer.train_step()
        used += row["rollout_env_steps"]
        computed += row.get("tokens_computed", float("nan"))
        row.update(env_steps_physical=used, tokens_computed_total=computed)
        if used >= next_eval or used >= budget:
            row.update(trainer.evaluate())
            next_eval += eval_every
        row["seconds_total"] = time.perf_counter() - started
        append_jsonl(metrics, row)
    (run_dir / "done").write_text("ok\n")


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def curves(out: Path, seeds: int) -> dict[str, list[tuple[list, list, list, list]]]:
    """Per strategy, per seed, at each evaluation: environment steps, tokens computed,
    unique tokens so far (what sampling with the prefix cache computes, within ~1%:
    benchmarks/tree_tokens.py), eval success."""
    data = {}
    for strategy in STRATEGIES:
        per_seed = []
        for seed in range(seeds):
            steps, computed, unique, success = [], [], [], []
            total_unique = 0.0
            for r in rows(out / strategy / f"seed{seed}"):
                total_unique += r.get("tokens_unique", 0.0)
                if "eval_success" in r:
                    steps.append(r.get("env_steps_physical", 0.0))
                    computed.append(r.get("tokens_computed_total", 0.0))
                    unique.append(total_unique)
                    success.append(r["eval_success"])
            per_seed.append((steps, computed, unique, success))
        data[strategy] = per_seed
    return data


def plot(out: Path, data: dict) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    lines = [(s, which, runs) for s, runs in data.items() for which in (0, 1)]
    lines.append(("independent, cache on", 2, data["independent"]))
    colors = {"independent": "C0", "patr": "C1", "rtpo": "C2", "independent, cache on": "C0"}
    for label, which, runs in lines:
        ax = axes[min(which, 1)]
        n = min(len(r[3]) for r in runs)
        first = 0 if which == 0 else 1  # token axis is logarithmic: no point at 0
        x = np.mean([r[which][first:n] for r in runs], axis=0)
        y = np.array([r[3][first:n] for r in runs])
        style = "--" if which == 2 else "-"
        name = f"{label} ({len(runs)} seeds)"
        ax.plot(x, y.mean(0), style, color=colors[label], lw=2, label=name)
        if which != 2:
            for run in runs:
                ax.plot(run[which][first:], run[3][first:], color=colors[label], alpha=0.2, lw=1)
            ax.fill_between(
                x, y.mean(0) - y.std(0), y.mean(0) + y.std(0), color=colors[label], alpha=0.1
            )
    axes[0].set_xlabel("environment steps (taken, not copies)")
    axes[1].set_xlabel("tokens computed in sampling (log scale; from the first evaluation)")
    axes[1].set_xscale("log")
    for ax in axes:
        ax.set_ylabel("eval success (32 maps, 2 samples, T=0.7)")
        ax.legend(fontsize=8)
    fig.suptitle("FrozenLake 3x3, tiny model: mean ± std over seeds (thin lines: seeds)")
    fig.tight_layout()
    path = out / "curves.png"
    fig.savefig(path, dpi=110)
    return path


COLLAPSE_MALFORMED = 0.4
"""A run collapsed when its last evaluation has success 0 and more than this share of
malformed moves."""


def summary(out: Path, seeds: int) -> str:
    """Every number docs/tree-rollouts.md quotes about a study, with per-seed columns."""
    lines = [
        "| strategy | eval success: start | end (mean ± sd) | end per seed | mean over evals "
        "| env steps | steps per leaf | tokens computed | unique tokens | updates | skipped "
        "| pruned leaves | collapsed | minutes |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for strategy, runs in curves(out, seeds).items():
        start = [r[3][0] for r in runs]
        end = [r[3][-1] for r in runs]
        average = [np.mean(r[3][1:]) for r in runs]
        raw = [rows(out / strategy / f"seed{seed}") for seed in range(seeds)]
        updates = [sum(r.get("updates", 1.0) for r in run[1:]) for run in raw]
        skipped = [sum(r.get("updates_skipped", 0.0) for r in run[1:]) for run in raw]
        leaves = [sum(r.get("leaves", r.get("episodes", 0.0)) for r in run[1:]) for run in raw]
        pruned = [sum(r.get("pruned_leaves", 0.0) for r in run[1:]) for run in raw]
        minutes = [run[-1]["seconds_total"] / 60 for run in raw]
        collapsed = sum(
            run[-1]["eval_success"] == 0 and run[-1]["eval_malformed_rate"] > COLLAPSE_MALFORMED
            for run in ([r for r in seed_rows if "eval_success" in r] for seed_rows in raw)
        )
        steps = [r[0][-1] for r in runs]
        lines.append(
            f"| {strategy} | {np.mean(start):.3f} | {np.mean(end):.3f} ± {np.std(end, ddof=1):.3f} "
            f"| {', '.join(f'{v:.2f}' for v in end)} "
            f"| {np.mean(average):.3f} ± {np.std(average, ddof=1):.3f} "
            f"| {np.mean(steps):,.0f} | {np.sum(steps) / np.sum(leaves):.2f} "
            f"| {np.mean([r[1][-1] for r in runs]):,.0f} "
            f"| {np.mean([r[2][-1] for r in runs]):,.0f} "
            f"| {np.mean(updates):.0f} | {np.mean(skipped):.0f} "
            f"| {np.sum(pruned) / max(np.sum(leaves), 1):.1%} | {collapsed} of {seeds} "
            f"| {np.mean(minutes):.1f} |"
        )
    lines += [
        "",
        "Means over seeds unless a column says otherwise; sd: sample standard deviation "
        "(ddof = 1); env steps are steps actually taken "
        "(copies of shared prefixes are not steps); skipped: RTPO turn positions where every "
        "sibling group tied; collapsed: last evaluation with success 0 and more than "
        f"{COLLAPSE_MALFORMED:.0%} malformed moves.",
    ]
    return "\n".join(lines)


def summarise(out: Path, seeds: int) -> None:
    """The report, the curves and the resource table of finished runs; the table also
    goes between the ``tree-rollouts-resources:<OUT's name>`` markers of the doc."""
    from turnrl.report import write_report
    from turnrl.study.markers import replace_block

    run_dirs = [out / s / f"seed{k}" for s in STRATEGIES for k in range(seeds)]
    report = write_report(run_dirs, out / "report.html", title="Tree rollouts on FrozenLake")
    figure = plot(out, curves(out, seeds))
    table = summary(out, seeds)
    (out / "summary.md").write_text(table + "\n")
    written = replace_block(DOC, "tree-rollouts-resources", out.name, table)
    print(table, f"\nreport: {report}\ncurves: {figure}", sep="\n")
    if written:
        print(f"{DOC}: table tree-rollouts-resources:{out.name} rewritten")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=6000, help="environment steps per run")
    parser.add_argument("--eval-every", type=float, default=1000, help="in environment steps")
    parser.add_argument("--out", default=str(STUDY / "lr3e-4"))
    parser.add_argument("--quick", action="store_true", help="1 seed, 300 steps, tiny warm start")
    parser.add_argument("--summarise", action="store_true", help="only rebuild report and tables")
    parser.add_argument("--cell", action="store_true", help="one study cell (see train_cell)")
    parser.add_argument("--config", help="with --cell: the recipe")
    parser.add_argument("overrides", nargs="*", help="with --cell: the cell's overrides")
    args = parser.parse_args()
    if args.cell:
        train_cell(Path(args.config), args.overrides, args.budget, args.eval_every)
        return
    if args.summarise:
        summarise(Path(args.out), args.seeds)
        return
    if not args.quick:
        raise SystemExit(
            "the study is declared in turnrl.study.catalogue: `make study-tree-rollouts` "
            "(or `turnrl study run tree-rollouts`, then `turnrl study summarise tree-rollouts` "
            "and `python examples/tree/run.py --summarise --out runs/studies/tree-rollouts/lr3e-4`)"
        )
    args.seeds, args.budget, args.eval_every = 1, 300, 150
    overrides = ["warm_start.steps=10", "env.n_eval_tasks=4", "rollout.tasks_per_step=2"]
    out = Path(args.out)
    for seed in range(args.seeds):
        warm = warm_start(out.parent / "warm", seed, overrides)
        for strategy in STRATEGIES:
            run_dir = out / strategy / f"seed{seed}"
            if (run_dir / "done").exists():
                continue
            print(f"{strategy} seed {seed} ...", flush=True)
            train(strategy, seed, warm, run_dir, args, overrides)
    summarise(out, args.seeds)


if __name__ == "__main__":
    main()
