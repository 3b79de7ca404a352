"""examples/agents/call_credit.py: the openings table on hand-built records, and bad
records named by file, line and field."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from turnrl.errors import InputError

PATH = Path(__file__).resolve().parents[1] / "examples" / "agents" / "call_credit.py"
_spec = importlib.util.spec_from_file_location("call_credit", PATH)
assert _spec is not None and _spec.loader is not None
call_credit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(call_credit)


def turn(traj: str, number: int, task: str, call: bool, reward: float, adv: float | None) -> str:
    return json.dumps(
        {
            "traj_id": traj,
            "turn": number,
            "task_id": task,
            "tool_call": {"name": "calculator"} if call else None,
            "reward": reward,
            "advantage": adv,
        }
    )


def write_run(root: Path, arm: str, lines: list[str]) -> Path:
    run = root / arm / "ws0-seed0"
    (run / "rollouts").mkdir(parents=True)
    (run / "rollouts" / "step-000001.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_openings_split_by_kind_opening_and_teacher_problem(tmp_path: Path) -> None:
    run = write_run(
        tmp_path,
        "pipeline",
        [
            # a call on a hard teacher problem: two turns (listed out of order), right
            turn("a", 1, "mul-317*400", True, 1.0, None),
            turn("a", 0, "mul-317*400", True, 0.0, 0.5),
            # two direct answers on a new easy problem: wrong, then right
            turn("b", 0, "add-1+2", False, 0.0, -0.25),
            turn("c", 0, "add-1+2", False, 1.0, 0.75),
            # a direct answer on the same hard teacher problem, advantage null: 0
            turn("d", 0, "mul-317*400", False, 0.0, None),
        ],
    )
    teacher = tmp_path / "teacher.jsonl"
    teacher.write_text(json.dumps({"task_id": "mul-317*400"}) + "\n")
    lines = call_credit.table([run], teacher)
    assert lines[2:] == [
        "| pipeline | easy | direct | new | 2 | 0.50 | +0.250 |",
        "| pipeline | hard | call | teacher | 1 | 1.00 | +0.500 |",
        "| pipeline | hard | direct | teacher | 1 | 0.00 | +0.000 |",
    ]


def test_malformed_line_and_missing_field_are_named(tmp_path: Path) -> None:
    teacher = tmp_path / "teacher.jsonl"
    teacher.write_text(json.dumps({"task_id": "t"}) + "\n")
    run = write_run(tmp_path, "node", [turn("a", 0, "t", False, 1.0, 0.0), "{not json"])
    with pytest.raises(InputError) as err:
        call_credit.table([run], teacher)
    assert err.value.source.endswith("step-000001.jsonl") and err.value.line == 2

    record = json.loads(turn("a", 0, "t", False, 1.0, 0.0))
    del record["reward"]
    run = write_run(tmp_path, "grpo", [json.dumps(record)])
    with pytest.raises(InputError, match=r"step-000001.jsonl:1: field 'reward': missing"):
        call_credit.table([run], teacher)

    teacher.write_text("\n" + json.dumps({"id": "t"}) + "\n")
    with pytest.raises(InputError, match=r"teacher.jsonl:2: field 'task_id': missing"):
        call_credit.table([], teacher)
