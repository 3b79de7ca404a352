"""Agent-loop studies behind docs/agents.md (run one at a time: CPU is shared).

``calc_openai``: the openai-client calculator agent (examples/agents/calc_openai.py)
from a warm start on its own calls answered by the teacher (tool on half of the
hard problems), then RL with ``grpo_mixed`` (every call a sample, all grouped by
question: the setting of the original report), ``grpo`` and ``node``; 3 seeds, one
warm start per seed shared by the three estimators.

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
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ROOT / "examples" / "agents"

STUDIES = {
    "calc_openai": {
        "config": AGENTS / "calc_openai.toml",
        "estimators": ("grpo_mixed", "grpo", "node"),
        "seeds": 3,
        "warm": [
            "warm_start.teacher_tasks=512",
            "warm_start.steps=800",
        ],
        "rl": [
            "rollout.tasks_per_step=8",
            "rollout.group_size=4",
            "train.steps=30",
            "train.eval_every=10",
            "train.checkpoint_every=10",
        ],
    },
    "calc_x": {
        "config": AGENTS / "calc_x" / "calc_x.toml",
        "estimators": ("grpo",),
        "seeds": 1,
        "warm": [],
        "rl": [],
    },
}
METRICS = ("eval_success", "eval_success_hard", "eval_tool_rate_hard", "eval_turns")


def train(config_path: Path, overrides: list[str]) -> Path:
    """One run, resumed if it was interrupted."""
    from turnrl.train.agent import AgentTrainer
    from turnrl.train.config import RunConfig, load_config

    config = load_config(RunConfig, config_path, [*overrides, "train.threads=1"])
    done = Path(config.run_dir) / "metrics.jsonl"
    if done.exists() and _last_step(done) >= config.train.steps:
        return Path(config.run_dir)
    return AgentTrainer(config, resume=True, quiet=False).run()


def _last_step(metrics: Path) -> int:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return max((r["step"] for r in rows), default=-1)


def run_study(name: str, out: Path) -> None:
    study = STUDIES[name]
    for seed in range(study["seeds"]):
        common = [f"train.seed={seed}", f"tasks.seed={seed}"]
        warm = out / "warm" / f"seed{seed}"
        train(study["config"], [*common, f"run_dir={warm}", *study["warm"], "train.steps=0"])
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
        + " | steps |",
        "|---|" + "---:|" * (len(METRICS) + 1),
    ]
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
        lines.append(f"| {estimator} | " + " | ".join(cells) + f" | {steps} |")
    text = "\n".join(lines)
    (out / "summary.md").write_text(text + "\n")
    return text


def _fmt(values: np.ndarray) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{np.nanmean(values):.2f} ± {np.nanstd(values):.2f}"


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
