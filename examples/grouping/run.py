"""The grouping experiment: does mixing turns in GRPO groups change tool use?

Same calculator setting, same warm start per seed, equal budgets; only the
credit estimator differs: ``grpo_mixed`` (legacy: all turns of all rollouts of a
question in one group), ``grpo`` (one value per rollout), ``turn_group``
((question, turn) groups) and ``node`` (exact decision points). Two settings:
no turn cost, and a per-turn cost (longer trajectories are worth less).

    python examples/grouping/run.py                # full: 3 seeds x 4 estimators x 2 costs
    python examples/grouping/run.py --quick        # 1 seed, few steps (smoke test)

Runs go to ``runs/grouping/<cost>/<estimator>/seed<k>``; the report to
``runs/grouping/report-<cost>.html``; a markdown summary to
``runs/grouping/summary.md``. Runs execute in parallel worker processes
(``--workers``, one torch thread each). Rerunning the command resumes: finished
warm starts are reused and runs continue from their last checkpoint.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "calculator.toml"
ESTIMATORS = ("grpo_mixed", "grpo", "turn_group", "node")
COSTS = {"no-cost": 0.0, "turn-cost": 0.15}


def train(overrides: list[str]) -> str:
    """One run; resumes from its last checkpoint, so a killed experiment continues."""
    from turnrl.train.config import RunConfig, load_config
    from turnrl.train.online import OnlineTrainer

    config = load_config(RunConfig, CONFIG, [*overrides, "train.threads=1"])
    if config.train.steps == 0 and (Path(config.run_dir) / "warm_start" / "config.json").exists():
        return config.run_dir  # this warm start exists already
    return str(OnlineTrainer(config, resume=True, quiet=True).run())


def tail_mean(run_dir: Path, key: str, last: int) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    values = [r[key] for r in rows if key in r]
    return float(np.mean(values[-last:])) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "runs" / "grouping"))
    parser.add_argument("--quick", action="store_true", help="1 seed, 4 steps, tiny warm start")
    parser.add_argument(
        "--summarise", action="store_true", help="only rebuild reports, figures and the summary"
    )
    args = parser.parse_args()
    seeds = 1 if args.quick else args.seeds
    steps = 4 if args.quick else args.steps
    out = Path(args.out)
    budget = [f"train.steps={steps}", "train.eval_every=10", "train.checkpoint_every=10"]
    if args.quick:
        budget += ["warm_start.steps=20", "env.n_eval_tasks=8", "train.eval_every=2"]

    # 1. one warm start per seed (shared by every estimator and cost setting)
    warm = {s: out / "warm" / f"seed{s}" for s in range(seeds)}
    if not args.summarise:
        run_all(args.workers, warm, budget, seeds, out)
    summarise(out, seeds, args.quick)


def run_all(workers: int, warm: dict[int, Path], budget: list[str], seeds: int, out: Path) -> None:
    with ProcessPoolExecutor(workers) as pool:
        list(
            pool.map(
                train,
                [
                    [*budget, f"run_dir={warm[s]}", f"train.seed={s}", "train.steps=0"]
                    for s in range(seeds)
                ],
            )
        )
    # 2. RL from each warm start with every estimator, with and without a turn cost
    jobs = []
    for cost_name, cost in COSTS.items():
        for estimator in ESTIMATORS:
            for s in range(seeds):
                run_dir = out / cost_name / estimator / f"seed{s}"
                jobs.append(
                    [
                        *budget,
                        f"run_dir={run_dir}",
                        f"label={estimator}",
                        f"train.seed={s}",
                        f"credit.estimator={estimator}",
                        f"warm_start.init_from={warm[s] / 'warm_start'}",
                        f"env.env_kwargs={{max_turns = 4, turn_cost = {cost}}}",
                    ]
                )
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(train, jobs))


def summarise(out: Path, seeds: int, quick: bool) -> None:
    """Reports, figures (docs/img) and the markdown summary table."""
    from turnrl.report import load_runs, write_report
    from turnrl.report.plots import plot_metric
    from turnrl.report.runs import group_by_label

    figures = ROOT / "docs" / "img"
    figures.mkdir(parents=True, exist_ok=True)

    lines = [
        "| setting | estimator | eval success | eval success (hard) | eval tool rate (hard) "
        "| train tool rate (hard), last 10 steps | eval turns |",
        "|---|---|---|---|---|---|---|",
    ]
    for cost_name in COSTS:
        runs = sorted((out / cost_name).glob("*/seed*"))
        report = write_report(
            runs, out / f"report-{cost_name}.html", title=f"grouping: {cost_name}"
        )
        print(f"report: {report}")
        if not quick:  # the figures the write-up shows (mean ± std over seeds)
            groups = group_by_label(load_runs(runs))
            for key in ("tool_rate_hard", "success_hard", "eval_success_hard"):
                png = plot_metric(groups, key, smoothing=1 if key.startswith("eval") else 5)
                (figures / f"grouping-{cost_name}-{key}.png").write_bytes(png)
        for estimator in ESTIMATORS:
            dirs = [out / cost_name / estimator / f"seed{s}" for s in range(seeds)]
            cells = []
            for key, last in (
                ("eval_success", 1),
                ("eval_success_hard", 1),
                ("eval_tool_rate_hard", 1),
                ("tool_rate_hard", 10),
                ("eval_turns", 1),
            ):
                values = [tail_mean(d, key, last) for d in dirs]
                cells.append(f"{np.mean(values):.2f} ± {np.std(values):.2f}")
            lines.append(f"| {cost_name} | {estimator} | " + " | ".join(cells) + " |")
    summary = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(summary)
    print(summary)


if __name__ == "__main__":
    main()
