"""The warm start check of finished agent runs, recomputed from their saved files.

For each run directory: its saved warm start (``warm_start/``), its teacher turns
(``rollouts/teacher.jsonl``), its training tasks (from its ``config.toml``) and its
step-0 evaluation (``metrics.jsonl``) go through
:func:`turnrl.train.agent.warm_quality.check_warm_start`, the check the agent loop runs
before RL; prints the teacher-forced shares per kind and turn and the warnings. With
``--write``, also replaces each run's recorded check (``warm_start_check.json`` and the
``warm_tf_*`` keys of its step-0 metrics row, marked ``recomputed_by``) by this one:
for runs that finished before the check changed, so that a study's table reads the
same check for every seed.

    python examples/agents/warm_check.py runs/studies/agents-parity/dr_grpo/seed*
    python examples/agents/warm_check.py --write runs/studies/agents-solver-checker/*/seed*
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from turnrl.records import parse_record
from turnrl.train.agent.tasks import load_tasks
from turnrl.train.agent.warm_quality import check_warm_start, replace_recorded_check
from turnrl.train.config import RunConfig, load_config
from turnrl.train.run import load_policy


def check(run: Path) -> tuple[dict[str, float], list[str]]:
    config = load_config(RunConfig, run / "config.toml", saved_copy=True)
    tasks = config.tasks
    train = load_tasks(tasks.train, n=tasks.n_train, seed=tasks.seed, kwargs=tasks.kwargs)
    path = run / "rollouts" / "teacher.jsonl"
    lines = path.read_text().splitlines()
    records = [
        parse_record(json.loads(line), source=str(path), line=i + 1) for i, line in enumerate(lines)
    ]
    greedy = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    policy = load_policy(run / "warm_start", config.policy)
    return check_warm_start(
        policy, records, train, greedy, max_new_tokens=config.policy.max_new_tokens
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished agent run directories")
    parser.add_argument("--write", action="store_true", help="replace each run's recorded check")
    args = parser.parse_args()
    for run in args.runs:
        metrics, warnings = check(run)
        shares = {k: round(v, 3) for k, v in metrics.items()}
        print(run, json.dumps(shares), *warnings, sep="\n  ")
        if args.write:
            replace_recorded_check(run, metrics, warnings, by="examples/agents/warm_check.py")


if __name__ == "__main__":
    main()
