"""The search-agent study: credit estimators on the ``lookup`` environment.

Recipe ``examples/lookup.toml`` (tiny character model, multi-hop questions over
a per-task knowledge base, BM25 search). One warm start (``--warm-seeds``: more),
shared by every arm and RL seed; every arm samples the same number of episodes
(``train.steps x tasks_per_step x group_size``, independent rollouts); only
the credit estimator differs:

    grpo               trajectory GRPO (outcome only)
    turn_group         return-to-go normalised within (question, turn index)
    gigpo              episode advantage + step advantage among identical anchor states
                       (here: the same set of facts retrieved)
    igpo               information gain + final reward normalised jointly, cumulative sums
    a2tgpo             turn-group-normalised IG, variance-rescaled, adaptive clip
    a2tgpo_joint       ... IG normalised over all turns of the question (ablation)
    a2tgpo_no_rescale  ... without dividing by sqrt(number of terms) (ablation)
    a2tgpo_no_clip     ... beta = 0: the ordinary clip range (ablation)

The runs are the ``search-agent`` study (declared in ``turnrl.study.catalogue``: 8
arms x 3 seeds, a warm start of its own per seed, so the seed spread includes the
warm start's); this script runs it through the harness and adds the study's
detailed tables (per hop, per turn position):

    python examples/lookup/run.py                  # = make study-search-agent + details
    python examples/lookup/run.py --summarise      # only the tables and figures
    python examples/lookup/run.py --quick --out /tmp/lookup   # 1 seed, 2 steps (smoke test,
                                                   # sequential, not through the harness)

Runs go to ``runs/studies/search-agent/<arm>/seed<k>`` (warm starts to
``.../warm/ws<k>``); the detailed tables to ``OUT/summary.md`` and, for the study's
directory, into ``docs/search-agent.md`` (between its ``search-agent:details``
markers); the figures to ``docs/img/search-*.png`` (not with ``--quick``).
Rerunning resumes: a finished run is skipped, a killed one continues from its last
checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from turnrl.io import atomic_write_text
from turnrl.train.config import RunConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "lookup.toml"
FIGURES = ROOT / "docs" / "img"
DOC = ROOT / "docs" / "search-agent.md"
STUDY = ROOT / "runs" / "studies" / "search-agent"
DOC_BEGIN = "<!-- study:search-agent:details -->"
DOC_END = "<!-- /study:search-agent:details -->"
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", {}),
    "igpo": ("igpo", {}),
    "a2tgpo": ("a2tgpo", {}),
    "gigpo": ("gigpo", {}),
    "turn_group": ("turn_group", {}),
    "a2tgpo_joint": ("a2tgpo", {"ig_norm": "joint"}),
    "a2tgpo_no_rescale": ("a2tgpo", {"rescale": False}),
    "a2tgpo_no_clip": ("a2tgpo", {"beta": 0.0}),
}
MAIN_ARMS = ("grpo", "igpo", "a2tgpo", "gigpo", "turn_group")
"""Run for every seed before the ablations."""
HOPS = (1, 2, 3)
POSITIONS = 5
"""Turn positions reported separately (0..4: up to three searches, an answer, a spare)."""


def toml_table(params: dict[str, Any]) -> str:
    """An inline TOML table for a command-line override: ``{ig_norm = "joint"}``."""
    return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in params.items()) + "}"


def train(overrides: list[str]) -> Path:
    """One run (resumed from its last checkpoint if it was killed)."""
    from turnrl.train.online.trainer import OnlineTrainer

    config = load_config(RunConfig, CONFIG, [*overrides, "train.threads=1"])
    return OnlineTrainer(config, resume=True, quiet=True).run()


def finished(run_dir: Path, steps: int) -> bool:
    """Whether ``run_dir`` logged its last step (or, for ``steps = 0``, its warm start)."""
    if steps == 0:
        return (run_dir / "warm_start" / "config.json").exists()
    return any(row.get("step") == steps for row in read_rows(run_dir))


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_all(out: Path, seeds: int, steps: int, budget: list[str], warm_seeds: int) -> None:
    """Every run: the warm starts, then the main arms seed by seed, then the ablations seed
    by seed (so that a study cut short has every seed of the main comparison first).

    RL seed ``k`` starts from warm start ``k mod warm_seeds``: with ``warm_seeds = 1``
    every seed shares one warm start and the seed spread is the RL's alone."""
    warm = [out / "warm" / f"ws{w}" for w in range(warm_seeds)]
    jobs: list[tuple[Path, list[str], int]] = [
        (w, [*budget, f"train.seed={k}", f"run_dir={w}", "train.steps=0"], 0)
        for k, w in enumerate(warm)
    ]
    for arms in (MAIN_ARMS, [arm for arm in ARMS if arm not in MAIN_ARMS]):
        for seed in range(seeds):
            for arm in arms:
                estimator, params = ARMS[arm]
                run_dir = out / arm / f"seed{seed}"
                overrides = [
                    *budget,
                    f"train.seed={seed}",
                    f"run_dir={run_dir}",
                    f"label={arm}",
                    f"train.steps={steps}",
                    f"credit.estimator={estimator}",
                    f"credit.params={toml_table(params)}",
                    f"warm_start.init_from={warm[seed % warm_seeds] / 'warm_start'}",
                ]
                jobs.append((run_dir, overrides, steps))
    for index, (run_dir, overrides, n_steps) in enumerate(jobs, start=1):
        if finished(run_dir, n_steps):
            print(f"[{index}/{len(jobs)}] {run_dir} done already", flush=True)
            continue
        started = time.perf_counter()
        train(overrides)
        seconds = time.perf_counter() - started
        print(f"[{index}/{len(jobs)}] {run_dir} {seconds:.0f} s", flush=True)


# ------------------------------------------------------------------ summary


def final_eval(run_dir: Path, steps: int) -> dict[str, float]:
    """The evaluation row of a run's step ``steps`` (0: a warm start); empty for a run that
    has not got there (left out of the tables rather than counted with its start)."""
    rows = [r for r in read_rows(run_dir) if "eval_success" in r and r.get("step") == steps]
    return rows[-1] if rows else {}


def turn_stats(run_dir: Path, field: str) -> dict[int, tuple[float, float, int]]:
    """``{turn position: (mean, std, count)}`` of a record field over the logged rollouts."""
    values: dict[int, list[float]] = defaultdict(list)
    for path in sorted((run_dir / "rollouts").glob("step-*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            value = record.get(field)
            if value is not None and record.get("train", True):
                values[min(record["turn"], POSITIONS - 1)].append(float(value))
    return {t: (float(np.mean(v)), float(np.std(v)), len(v)) for t, v in sorted(values.items())}


def cell(values: list[float], digits: int = 2) -> str:
    """``mean ± sd`` over seeds (sample sd, ddof 1; "–" for one value)."""
    values = [v for v in values if not np.isnan(v)]
    if not values:
        return "–"
    sd = f"{np.std(values, ddof=1):.{digits}f}" if len(values) > 1 else "–"
    return f"{np.mean(values):.{digits}f} ± {sd}"


def per_seed(values: list[float], digits: int = 2) -> str:
    return " / ".join("–" if np.isnan(v) else f"{v:.{digits}f}" for v in values)


def summarise(
    out: Path, seeds: int, warm_seeds: int, steps: int, logged_every: int, figures: bool
) -> str:
    """Every table the write-up quotes (markdown, also written to OUT/summary.md) and,
    with ``figures``, its figures in docs/img."""
    labels = ["warm start", *ARMS]
    dirs = {
        "warm start": [out / "warm" / f"ws{s}" for s in range(warm_seeds)],
        **{arm: [out / arm / f"seed{s}" for s in range(seeds)] for arm in ARMS},
    }
    finals = {
        label: [final_eval(d, 0 if label == "warm start" else steps) for d in dirs[label]]
        for label in labels
    }

    def column(label: str, key: str) -> list[float]:
        return [float(f.get(key, np.nan)) for f in finals[label]]

    lines = [
        f"{seeds} RL seeds from {warm_seeds} warm start(s); every number below a mean ± sd "
        "over the seeds (sample sd, ddof 1) unless it says otherwise; arms compared pair "
        "by pair with intervals: the study's own tables (`turnrl study summarise "
        "search-agent`).",
        "",
        f"Held-out success (greedy, {seeds} seeds: mean ± std, then seed by seed)",
        "",
        "| arm | success | 1-hop | 2-hop | 3-hop | success per seed |",
        "|---|---|---|---|---|---|",
    ]
    for label in labels:
        hops = [cell(column(label, f"eval_success_hop{h}")) for h in HOPS]
        lines.append(
            f"| {label} | {cell(column(label, 'eval_success'))} | {' | '.join(hops)} "
            f"| {per_seed(column(label, 'eval_success'))} |"
        )
    lines += [
        "",
        "Turns per episode and search calls per question (held-out, greedy)",
        "",
        "| arm | turns | searches | searches 1-hop | searches 2-hop | searches 3-hop "
        "| malformed turns | searches per seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label in labels:
        searches = [cell(column(label, f"eval_tool_calls_hop{h}")) for h in HOPS]
        lines.append(
            f"| {label} | {cell(column(label, 'eval_turns'))} "
            f"| {cell(column(label, 'eval_tool_calls'))} | {' | '.join(searches)} "
            f"| {cell(column(label, 'eval_malformed_rate'))} "
            f"| {per_seed(column(label, 'eval_tool_calls'))} |"
        )

    # Advantages by turn position, over the logged training batches.
    def logged(arm: str, field: str) -> list[dict[int, tuple[float, float, int]]]:
        """Per seed (``{}`` for a run that has not finished)."""
        return [turn_stats(d, field) if finished(d, steps) else {} for d in dirs[arm]]

    adv = {arm: logged(arm, "advantage") for arm in ARMS}
    header = " | ".join(f"turn {t}" for t in range(POSITIONS - 1)) + f" | turn {POSITIONS - 1}+"
    for title, index in (("mean", 0), ("std", 1)):
        lines += [
            "",
            f"Advantage {title} by turn position (training batches logged every "
            f"{logged_every} steps; "
            "mean ± std over seeds)",
            "",
            f"| arm | {header} |",
            "|---|" + "---|" * POSITIONS,
        ]
        for arm in ARMS:
            cells = [
                cell([s[t][index] if t in s else np.nan for s in adv[arm]])
                for t in range(POSITIONS)
            ]
            lines.append(f"| {arm} | {' | '.join(cells)} |")
    lines += [
        "",
        "Spread of the advantage std across turn positions 0-3 (max / min, per seed; "
        "1 = the same scale at every position)",
        "",
        "| arm | max/min std ratio | per seed |",
        "|---|---|---|",
    ]
    for arm in ARMS:
        ratios = []
        for stats in adv[arm]:
            stds = [stats[t][1] for t in range(POSITIONS - 1) if t in stats and stats[t][2] >= 20]
            ratios.append(max(stds) / min(stds) if stds and min(stds) > 0 else np.nan)
        lines.append(f"| {arm} | {cell(ratios)} | {per_seed(ratios)} |")
    ig = {arm: logged(arm, "info_gain") for arm in ARMS}
    ig_arms = [arm for arm in ARMS if any(ig[arm])]
    if ig_arms:
        lines += [
            "",
            "Information gain by turn position (raw, training batches; mean over seeds of "
            "each seed's mean)",
            "",
            f"| arm | {header} |",
            "|---|" + "---|" * POSITIONS,
        ]
        for arm in ig_arms:
            cells = [
                cell([s[t][0] if t in s else np.nan for s in ig[arm]]) for t in range(POSITIONS)
            ]
            lines.append(f"| {arm} | {' | '.join(cells)} |")
    text = "\n".join(lines) + "\n"
    atomic_write_text(out / "summary.md", text)
    if figures:
        with warnings.catch_warnings():  # arms without finished runs: nan means, no bar
            warnings.simplefilter("ignore", RuntimeWarning)
            write_figures(out, dirs, finals, adv)
    return text


def write_into_doc(doc: Path, tables: str) -> None:
    """Replace the block between ``DOC_BEGIN`` and ``DOC_END`` in the write-up with ``tables``
    (so the page always shows what the last ``--summarise`` computed)."""
    text = doc.read_text() if doc.exists() else ""
    if DOC_BEGIN not in text or DOC_END not in text:
        print(f"{doc}: no table block ({DOC_BEGIN} ... {DOC_END}); tables left in summary.md")
        return
    head, rest = text.split(DOC_BEGIN, 1)
    _, tail = rest.split(DOC_END, 1)
    atomic_write_text(doc, f"{head}{DOC_BEGIN}\n\n{tables}\n{DOC_END}{tail}")


def write_figures(out: Path, dirs, finals, adv) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from turnrl.report import load_runs
    from turnrl.report.plots import plot_metric
    from turnrl.report.runs import group_by_label

    FIGURES.mkdir(parents=True, exist_ok=True)
    labels = list(finals)
    # 1. held-out success by hop count: bars (mean over seeds) and one dot per seed
    fig = Figure(figsize=(11, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / len(HOPS)
    for j, hop in enumerate(HOPS):
        key = f"eval_success_hop{hop}"
        x = np.arange(len(labels)) + (j - 1) * width
        values = [[float(f.get(key, np.nan)) for f in finals[label]] for label in labels]
        ax.bar(x, [np.nanmean(v) for v in values], width, label=f"{hop}-hop")
        for xi, v in zip(x, values, strict=True):
            ax.plot([xi] * len(v), v, "k.", markersize=3)
    ax.set_xticks(np.arange(len(labels)), labels, rotation=20, ha="right")
    ax.set_ylabel("held-out success (greedy)")
    ax.set_ylim(0, 1)
    ax.legend()
    fig.tight_layout()
    fig.savefig(FIGURES / "search-success-by-hop.png", dpi=110)
    # 2. advantage mean and std by turn position
    fig = Figure(figsize=(11, 4))
    FigureCanvasAgg(fig)
    for panel, (index, title) in enumerate(((0, "mean"), (1, "std"))):
        ax = fig.add_subplot(1, 2, panel + 1)
        for arm, seeds_stats in adv.items():
            ys = [
                np.nanmean([s[t][index] if t in s else np.nan for s in seeds_stats])
                for t in range(POSITIONS)
            ]
            style = "-" if arm in ("igpo", "a2tgpo") else "--"
            ax.plot(range(POSITIONS), ys, style, marker="o", label=arm)
        ax.set_xticks(range(POSITIONS), [*map(str, range(POSITIONS - 1)), f"{POSITIONS - 1}+"])
        ax.set_xlabel("turn position")
        ax.set_title(f"advantage {title} (training batches)")
        if panel == 1:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(FIGURES / "search-advantage-by-turn.png", dpi=110)
    # 3. held-out success over training (mean ± std over seeds)
    runs = load_runs([d for arm in ARMS for d in dirs[arm] if (d / "metrics.jsonl").exists()])
    png = plot_metric(group_by_label(runs), "eval_success")
    (FIGURES / "search-eval-success.png").write_bytes(png)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="study processes")
    parser.add_argument("--out", default=str(STUDY), help="where the runs are (--quick: go)")
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 steps, tiny warm start")
    parser.add_argument("--summarise", action="store_true", help="only the tables and figures")
    args = parser.parse_args()
    out = Path(args.out)
    budget: list[str] = []
    if args.quick:
        budget = ["warm_start.steps=5", "env.n_eval_tasks=6", "train.eval_every=1"]
        budget += ["train.log_rollouts_every=1", "rollout.tasks_per_step=2", "train.steps=2"]
    recipe = load_config(RunConfig, CONFIG, budget)
    steps = recipe.train.steps
    if args.quick:
        seeds = warm_seeds = 1
        if not args.summarise:
            run_all(out, seeds, steps, budget, warm_seeds)
    else:
        from turnrl.cli import main as turnrl
        from turnrl.study.catalogue import get_study

        seeds = warm_seeds = len(get_study("search-agent").seeds)  # a warm start per seed
        if not args.summarise:
            code = turnrl(["study", "run", "search-agent", f"--jobs={args.jobs}"])
            if code:
                raise SystemExit(code)
            turnrl(["study", "summarise", "search-agent"])
    tables = summarise(
        out, seeds, warm_seeds, steps, recipe.train.log_rollouts_every, figures=not args.quick
    )
    print(tables)
    if not args.quick and out.resolve() == STUDY.resolve():
        write_into_doc(DOC, tables)


if __name__ == "__main__":
    main()
