"""Agent-loop studies behind docs/agents.md (run one at a time: CPU is shared).

``calc_openai``: the openai-client calculator agent (examples/agents/calc_openai.py)
from a warm start on its own calls answered by the teacher (tool on half of the
hard problems), then RL with ``grpo_mixed`` (every call a sample, all grouped by
question: the setting of the original report), ``grpo`` and ``node``; 3 RL seeds
from one warm start (3000 SFT steps: 800 did not teach the tiny model to copy the
numbers into the tool call through this agent's longer prompt), shared by every
run (``warm_seeds``; one warm start per seed costs 3x its CPU time).

``calc_openai_long``: calc_openai with the grouping experiment's RL budget (40 steps
x 8 problems x 8 rollouts), one seed, from calc_openai's warm start.

``calc_x``: the autogen calc_x agent (examples/agents/calc_x/) from its teacher
warm start, trained for 20 steps with ``grpo``.

    python examples/agents/study.py calc_openai          # runs, then the summary
    python examples/agents/study.py calc_x
    python examples/agents/study.py calc_openai --summarise

Runs go to ``runs/agents/<study>/...``; rerunning resumes (finished warm starts are
reused, runs continue from their last checkpoint). The summary (markdown) is
printed and written to ``runs/agents/<study>/summary.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from turnrl.io import append_jsonl

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ROOT / "examples" / "agents"

STUDIES = {
    "calc_openai": {
        "config": AGENTS / "calc_openai.toml",
        "estimators": ("grpo_mixed", "grpo", "node"),
        "seeds": 3,
        "warm_seeds": 1,
        "warm": [
            "warm_start.teacher_tasks=512",
            "warm_start.steps=3000",
        ],
        "rl": [
            "rollout.tasks_per_step=8",
            "rollout.group_size=4",
            "train.steps=20",
            "train.eval_every=10",
            "train.checkpoint_every=10",
        ],
    },
    # calc_openai with the grouping experiment's RL budget (40 steps x 8 problems x 8
    # rollouts, 4x the episodes), one seed, from calc_openai's warm start.
    "calc_openai_long": {
        "config": AGENTS / "calc_openai.toml",
        "estimators": ("grpo_mixed", "grpo", "node"),
        "seeds": 1,
        "warm_seeds": 1,
        "warm_from": "calc_openai",
        "warm": [
            "warm_start.teacher_tasks=512",
            "warm_start.steps=3000",
        ],
        "rl": [
            "rollout.tasks_per_step=8",
            "rollout.group_size=8",
            "train.steps=40",
            "train.eval_every=10",
            "train.checkpoint_every=10",
        ],
    },
    "calc_x": {
        "config": AGENTS / "calc_x" / "calc_x.toml",
        "estimators": ("grpo",),
        "seeds": 1,
        "warm_seeds": 1,
        "warm": ["warm_start.teacher_tasks=128", "warm_start.steps=1200"],
        # 2 problems per step and 16 held-out ones (the config: 4 and 32), to finish on
        # a shared 2-core machine: every rollout starts an MCP server process.
        "rl": ["rollout.tasks_per_step=2", "tasks.n_eval=16"],
    },
}
METRICS = (
    "eval_success",
    "eval_success_hard",
    "eval_success_easy",
    "eval_tool_rate_hard",
    "eval_tool_rate_easy",
    "eval_turns",
)
WALL = "wall.jsonl"
"""One line per run that this script ran to its end: its wall-clock seconds."""


def train(config_path: Path, overrides: list[str]) -> Path:
    """One run, resumed if it was interrupted; its wall time appended to ``wall.jsonl``
    next to the study's runs (a resumed run's line covers only the last part)."""
    from turnrl.train.agent.loop import AgentTrainer
    from turnrl.train.config import RunConfig, load_config

    config = load_config(RunConfig, config_path, [*overrides, "train.threads=1"])
    done = Path(config.run_dir) / "metrics.jsonl"
    if done.exists() and _last_step(done) >= config.train.steps:
        return Path(config.run_dir)
    started = time.perf_counter()
    run = AgentTrainer(config, resume=True, quiet=False).run()
    append_jsonl(
        run.parents[1] / WALL,
        {"run": f"{run.parent.name}/{run.name}", "seconds": time.perf_counter() - started},
    )
    return run


def _last_step(metrics: Path) -> int:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return max((r["step"] for r in rows), default=-1)


def run_study(name: str, out: Path) -> None:
    study = STUDIES[name]
    for seed in range(study["seeds"]):
        # The task sets (training pool, held-out set) are the same for every seed: the
        # seed varies the warm start (when there are several), the RL sampling and the
        # order tasks are drawn in.
        common = [f"train.seed={seed}"]
        warm_seed = seed % study["warm_seeds"]
        warm_out = out.parent / study["warm_from"] if "warm_from" in study else out
        warm = warm_out / "warm" / f"seed{warm_seed}"
        train(
            study["config"],
            [
                f"train.seed={warm_seed}",
                f"run_dir={warm}",
                *study["warm"],
                "train.steps=0",
            ],
        )
        for estimator in study["estimators"]:
            train(
                study["config"],
                [
                    *common,
                    f"run_dir={out / estimator / f'seed{seed}'}",
                    f"label={name} {estimator}",
                    f"credit.estimator={estimator}",
                    "warm_start.teacher=none",
                    f"warm_start.init_from={warm / 'warm_start'}",
                    *study["rl"],
                ],
            )


def evaluations(run_dir: Path) -> tuple[dict, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval_success" in r]
    return evals[0], evals[-1]


def summarise(name: str, out: Path) -> str:
    study = STUDIES[name]
    lines = [
        f"Held-out evaluation (greedy), mean ± sd over {study['seeds']} seed(s); "
        "before = after the warm start (step 0), after = the last step.",
        "",
        "| estimator | "
        + " | ".join(f"{m.removeprefix('eval_')} before -> after" for m in METRICS)
        + " | steps | wall s per run |",
        "|---|" + "---:|" * (len(METRICS) + 2),
    ]
    walls = {}
    if (out / WALL).exists():
        for line in (out / WALL).read_text().splitlines():
            row = json.loads(line)
            walls[row["run"]] = row["seconds"]
    for estimator in study["estimators"]:
        runs = sorted((out / estimator).glob("seed*"))
        pairs = [evaluations(run) for run in runs if (run / "metrics.jsonl").exists()]
        if not pairs:
            continue
        cells = []
        for metric in METRICS:
            before = np.array([b.get(metric, np.nan) for b, _ in pairs])
            after = np.array([a.get(metric, np.nan) for _, a in pairs])
            cells.append(f"{_fmt(before)} -> {_fmt(after)}")
        steps = ", ".join(str(a["step"]) for _, a in pairs)
        wall = [
            walls[f"{estimator}/{run.name}"] for run in runs if f"{estimator}/{run.name}" in walls
        ]
        wall_cell = f"{np.mean(wall):.0f}" if wall else "-"
        lines.append(f"| {estimator} | " + " | ".join(cells) + f" | {steps} | {wall_cell} |")
    text = "\n".join(lines)
    (out / "summary.md").write_text(text + "\n")
    return text


def _fmt(values: np.ndarray) -> str:
    """``mean ± sd (per seed)``: sample sd (ddof 1), then every seed's value."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    seeds = ", ".join(f"{v:.2f}" for v in values)
    return f"{np.nanmean(values):.2f} ± {np.nanstd(values, ddof=1):.2f} ({seeds})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("study", choices=sorted(STUDIES))
    parser.add_argument("--out", help="default: runs/agents/<study>")
    parser.add_argument("--summarise", action="store_true", help="only rebuild the summary")
    args = parser.parse_args()
    out = Path(args.out) if args.out else ROOT / "runs" / "agents" / args.study
    if not args.summarise:
        run_study(args.study, out)
    print(summarise(args.study, out))


if __name__ == "__main__":
    main()
