"""What the rollouts RL trained on say about calling, per arm: from the saved records.

Every training step's records (``rollouts/step-*.jsonl``) keep each turn's advantage
and reward. A rollout opens with a call (its first turn has ``tool_call``) or a direct
answer; its outcome is the reward of its last turn. Per arm (the run directory's
parent), kind of problem (hard: a product, ``*`` in the task id) and opening, and split
by whether the problem was one of the warm start's teacher problems (``--teacher``: its
``rollouts/teacher.jsonl``; the warm start may have memorised those answers), prints
the number of rollouts, their success, and the mean advantage of the opening turn
(the estimator's, before the update's per-token aggregation): whether the tool paid,
and whether credit pushed toward it or away.

    python examples/agents/call_credit.py \\
        --teacher runs/studies/agents-calc-x-warm/recipe/seed0/rollouts/teacher.jsonl \\
        runs/studies/agents-calc-x-489/tool-pays/*/ws0-seed*
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from turnrl.errors import InputError
from turnrl.strict_json import iter_jsonl

Key = tuple[str, str, str, str]
"""(arm, kind, opening, ``teacher``/``new``)."""


FIELDS = ("traj_id", "turn", "task_id", "tool_call", "reward")
"""What every record must have (``advantage`` may be absent or null: 0)."""


def records(path: Path) -> list[dict[str, Any]]:
    """The records of one JSONL file; a malformed line or a missing field raises
    :class:`InputError` naming the file, line and field."""
    out = []
    for number, record in iter_jsonl(path):
        if not isinstance(record, dict):
            raise InputError(str(path), number, None, "expected a JSON object (a turn record)")
        for field in FIELDS:
            if field not in record:
                raise InputError(str(path), number, field, "missing")
        out.append(record)
    return out


def openings(run: Path, teacher: set[str]) -> dict[Key, list[tuple[float, float]]]:
    """Key -> (outcome, advantage of the first turn) of every rollout RL trained on."""
    out: dict[Key, list[tuple[float, float]]] = defaultdict(list)
    for path in sorted((run / "rollouts").glob("step-*.jsonl")):
        rollouts: dict[str, list[dict]] = defaultdict(list)
        for record in records(path):
            rollouts[record["traj_id"]].append(record)
        for turns in rollouts.values():
            turns.sort(key=lambda r: r["turn"])
            first = turns[0]
            kind = "hard" if "*" in first["task_id"] else "easy"
            opening = "call" if first["tool_call"] else "direct"
            seen = "teacher" if first["task_id"] in teacher else "new"
            advantage = float(first.get("advantage") or 0.0)
            out[(run.parent.name, kind, opening, seen)].append((turns[-1]["reward"], advantage))
    return out


def table(runs: list[Path], teacher_file: Path) -> list[str]:
    """The markdown table of every run's openings (see the module docstring)."""
    teacher = set()
    for number, record in iter_jsonl(teacher_file):
        if not isinstance(record, dict) or "task_id" not in record:
            raise InputError(str(teacher_file), number, "task_id", "missing")
        teacher.add(record["task_id"])
    rows: dict[Key, list[tuple[float, float]]] = defaultdict(list)
    for run in runs:
        for key, values in openings(run, teacher).items():
            rows[key] += values
    lines = [
        "| arm | kind | opening | problem | rollouts | success | mean advantage (opening) |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for (arm, kind, opening, seen), values in sorted(rows.items()):
        outcome, advantage = np.array(values).T
        lines.append(
            f"| {arm} | {kind} | {opening} | {seen} | {len(values)} | {outcome.mean():.2f} | "
            f"{advantage.mean():+.3f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--teacher", type=Path, required=True, help="the warm start's teacher.jsonl"
    )
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    try:
        print("\n".join(table(args.runs, args.teacher)))
    except InputError as err:
        sys.exit(f"call_credit.py: {err}")


if __name__ == "__main__":
    main()
