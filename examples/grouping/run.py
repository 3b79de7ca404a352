"""The grouping experiment's learning runs: do the arms the gradient projection
separates move the turn-0 tool rate apart when they learn?

Setting ``examples/grouping/medium.toml`` at one per-turn cost, every run starting
from the frozen warm start of ``gradient.py`` (so the seeds are paired: seed ``k``
of every arm draws the same tasks in the same order), ``--steps`` RL steps each,
evaluated every 10 steps on the 64 held-out medium tasks with 4 samples each at
temperature 1. The measured behaviour is ``eval_tool_open_rate``: the share of
evaluation episodes whose first response is a tool call.

    python examples/grouping/run.py --cost 0.4            # 3 arms x 5 seeds x 60 steps
    python examples/grouping/run.py --cost 0.4 --summarise
    python examples/grouping/run.py --quick --out /tmp/gr   # smoke test

Runs go to ``OUT/cost<c>-steps<n>/<arm>/seed<k>`` (one after the other, one torch thread;
rerunning resumes: finished runs are skipped, a killed one continues from its last
checkpoint); ``OUT/cost<c>-steps<n>/summary.md`` holds every table
docs/grouping-experiment.md quotes (with per-seed columns) and the verdict;
``docs/img/grouping-learning-cost<c>-steps<n>.png`` the curves.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from gradient import SETTING, Arm, arms  # noqa: E402

DEFAULT_ARMS = ("grpo_mixed/token-mean/all", "grpo/token-mean/all", "node/token-mean/all")
KEY = "eval_tool_open_rate"


def arm_by_name(name: str) -> Arm:
    known = {arm.name: arm for arm in arms()}
    if name not in known:
        raise SystemExit(f"unknown arm {name!r}; known: {', '.join(known)}")
    arm = known[name]
    if arm.legacy or not arm.later:
        raise SystemExit(
            f"arm {name!r} changes which rows are trained; the trainer runs only arms that "
            "differ by estimator and aggregation"
        )
    return arm


def train(arm: Arm, seed: int, run_dir: Path, warm: Path, cost: float, overrides: list[str]):
    from turnrl.train.config import RunConfig, load_config
    from turnrl.train.online import OnlineTrainer

    if (run_dir / "done").exists():
        return
    params = "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in arm.params.items()) + "}"
    config = load_config(
        RunConfig,
        SETTING,
        [
            *overrides,
            f"run_dir={run_dir}",
            f"label={arm.name}",
            f"train.seed={seed}",
            f"warm_start.init_from={warm}",
            f"credit.estimator={arm.estimator}",
            f"credit.params={params}",
            f"train.aggregation={arm.aggregation}",
            f"env.env_kwargs.turn_cost={cost}",
            "train.threads=1",
        ],
    )
    OnlineTrainer(config, resume=True, quiet=True).run()
    (run_dir / "done").write_text("ok\n")


def series(run_dir: Path, key: str) -> tuple[list[int], list[float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    pairs = [(int(r["step"]), float(r[key])) for r in rows if key in r]
    return [s for s, _ in pairs], [v for _, v in pairs]


def verdict(change: dict[str, np.ndarray], paired: dict[str, np.ndarray]) -> str:
    """The issue's rule, made explicit: a change "falls"/"rises" when its mean over seeds
    is beyond one seed standard deviation from 0; "reproduced" needs grpo_mixed to fall
    while grpo and node rise; "refuted" needs grpo_mixed's paired difference to each of
    grpo and node to stay within one standard deviation of the seeds."""

    def moves(values: np.ndarray) -> int:
        mean, std = float(values.mean()), float(values.std(ddof=1)) if values.size > 1 else 0.0
        return 1 if mean > std else -1 if mean < -std else 0

    mixed, grpo, node = (change.get(k) for k in DEFAULT_ARMS)
    if mixed is None or grpo is None or node is None:
        return "no verdict: the three default arms are needed"
    if moves(mixed) < 0 and moves(grpo) > 0 and moves(node) > 0:
        return "reproduced: grpo_mixed's tool rate fell while grpo's and node's rose"
    if all(moves(values) == 0 for values in paired.values()):
        return (
            "refuted: grpo_mixed's tool rate stayed within the seed spread of grpo's and "
            "node's (paired differences within one standard deviation of 0)"
        )
    return "neither: the arms moved apart, but not in the pattern #489 describes"


OUTCOMES = ("eval_return", "eval_success", "eval_turns")
"""What the behaviour change bought: held-out return (cost included), success, turns."""


def outcome_table(out: Path, names: list[str], seeds: int) -> list[str]:
    """Start and end of each outcome metric per arm (mean ± std and per seed)."""
    lines = [
        "| arm | metric | start | end (mean ± std) | end per seed |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        runs = [out / name.replace("/", "_") / f"seed{s}" for s in range(seeds)]
        for key in OUTCOMES:
            values = [series(r, key)[1] for r in runs]
            start = np.array([v[0] for v in values])
            end = np.array([v[-1] for v in values])
            lines.append(
                f"| {name} | {key} | {start.mean():.3f} | {end.mean():.3f} ± "
                f"{end.std(ddof=1):.3f} | {', '.join(f'{v:.3f}' for v in end)} |"
            )
    return lines


def summarise(out: Path, names: list[str], seeds: int, figure: Path | None) -> str:
    start, end = {}, {}
    curves: dict[str, list[tuple[list[int], list[float]]]] = {}
    for name in names:
        runs = [out / name.replace("/", "_") / f"seed{s}" for s in range(seeds)]
        runs = [r for r in runs if (r / "done").exists()]
        if not runs:
            continue
        curves[name] = [series(r, KEY) for r in runs]
        start[name] = np.array([values[0] for _, values in curves[name]])
        end[name] = np.array([values[-1] for _, values in curves[name]])
    lines = [
        f"| arm | seeds | {KEY}: start | end (mean ± std) | change (mean ± std) | "
        "end per seed | train tool_open_rate, last 10 steps (mean ± std) |",
        "|---|---|---|---|---|---|---|",
    ]
    change = {name: end[name] - start[name] for name in end}
    for name in end:
        train_tail = [
            np.mean(series(out / name.replace("/", "_") / f"seed{s}", "tool_open_rate")[1][-10:])
            for s in range(len(end[name]))
        ]
        lines.append(
            f"| {name} | {len(end[name])} | {start[name].mean():.3f} "
            f"| {end[name].mean():.3f} ± {end[name].std(ddof=1):.3f} "
            f"| {change[name].mean():+.3f} ± {change[name].std(ddof=1):.3f} "
            f"| {', '.join(f'{v:.3f}' for v in end[name])} "
            f"| {np.mean(train_tail):.3f} ± {np.std(train_tail, ddof=1):.3f} |"
        )
    paired = {}
    mixed = DEFAULT_ARMS[0]
    if mixed in end:
        lines += ["", "| paired difference of the end value | mean ± std | per seed |"]
        lines.append("|---|---|---|")
        for other in DEFAULT_ARMS[1:]:
            if other in end and len(end[other]) == len(end[mixed]):
                diff = end[mixed] - end[other]
                paired[other] = diff
                lines.append(
                    f"| {mixed} - {other} | {diff.mean():+.3f} ± {diff.std(ddof=1):.3f} "
                    f"| {', '.join(f'{v:+.3f}' for v in diff)} |"
                )
    lines += ["", *outcome_table(out, list(end), len(next(iter(end.values()), [])))]
    lines += ["", f"Verdict: {verdict(change, paired)}."]
    if figure is not None and curves:
        plot(curves, figure)
    return "\n".join(lines)


def plot(curves: dict[str, list[tuple[list[int], list[float]]]], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 3.8), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for index, (name, runs) in enumerate(curves.items()):
        color = f"C{index}"
        n = min(len(v) for _, v in runs)
        steps = runs[0][0][:n]
        values = np.array([v[:n] for _, v in runs])
        for _, v in runs:
            axes.plot(steps, v[:n], color=color, alpha=0.25, linewidth=0.8)
        axes.plot(steps, values.mean(0), color=color, linewidth=2, label=f"{name} ({len(runs)})")
    axes.set_xlabel("RL step")
    axes.set_ylabel("held-out turn-0 tool rate (T = 1)")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cost", type=float, required=True, help="per-turn cost")
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", default=str(ROOT / "runs" / "grouping"))
    parser.add_argument("--warm", default=None, help="default: OUT/gradient/warm/warm_start")
    parser.add_argument("--quick", action="store_true", help="1 seed, 4 steps")
    parser.add_argument("--summarise", action="store_true")
    args = parser.parse_args()
    names = [n.strip() for n in args.arms.split(",") if n.strip()]
    selected = [arm_by_name(n) for n in names]
    seeds = 1 if args.quick else args.seeds
    root = Path(args.out)
    steps = 4 if args.quick else args.steps
    out = root / f"cost{args.cost:g}-steps{steps}"
    warm = Path(args.warm) if args.warm else root / "gradient" / "warm" / "warm_start"
    overrides = [f"train.steps={steps}"]
    if args.quick:
        overrides += ["env.n_eval_tasks=4", "train.eval_every=2", "train.eval_samples=1"]
    if not args.summarise:
        if not (warm / "config.json").exists():
            raise SystemExit(f"no warm start at {warm}: run examples/grouping/gradient.py first")
        for seed in range(seeds):
            for arm in selected:
                run_dir = out / arm.name.replace("/", "_") / f"seed{seed}"
                print(f"{arm.name} seed {seed}", flush=True)
                train(arm, seed, run_dir, warm, args.cost, overrides)
    png = ROOT / "docs" / "img" / f"grouping-learning-cost{args.cost:g}-steps{steps}.png"
    figure = None if args.quick else png
    text = summarise(out, names, seeds, figure)
    (out / "summary.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
