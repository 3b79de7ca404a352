"""The agent teacher's tool share per kind, demonstrated per draw (issue #25): one
teacher rollout per variant of the calculator's demonstrations, weighted by its share."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from turnrl.train.agent.teacher_mix import DEMO_KEY, demo_options, teacher_jobs, weighted_examples
from turnrl.train.update.sft import TurnExample
from turnrl.types import Task, TurnRecord

AGENTS = Path(__file__).resolve().parents[1] / "examples" / "agents"
HARD = Task("t-hard", {"expression": "317*400", "answer": "126800"}, ("hard",))
EASY = Task("t-easy", {"expression": "2+3", "answer": "5"}, ("easy",))


def calc_teacher():
    spec = importlib.util.spec_from_file_location("calc_teacher", AGENTS / "calc_teacher.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_task_runs_once_per_variant_with_its_share() -> None:
    jobs = teacher_jobs([HARD, EASY], "calculator", tool_fraction=0.4, easy_tool_fraction=0.0)
    assert [(rid, task.task_id, task.payload[DEMO_KEY], p) for rid, task, p in jobs] == [
        ("w-0000-v0", "t-hard", {"use_tool": True}, 0.4),
        ("w-0000-v1", "t-hard", {"use_tool": False}, 0.6),
        ("w-0001-v0", "t-easy", {"use_tool": False}, 1.0),  # share 0: one variant
    ]
    assert jobs[0][1].tags == ("hard",)
    assert DEMO_KEY not in HARD.payload  # the task itself is left alone


def test_both_kinds_get_the_tool_share() -> None:
    jobs = teacher_jobs([EASY], "calculator", tool_fraction=0.4, easy_tool_fraction=0.4)
    assert [(task.payload[DEMO_KEY], p) for _, task, p in jobs] == [
        ({"use_tool": True}, 0.4),
        ({"use_tool": False}, pytest.approx(0.6)),
    ]


def test_an_environment_without_variants_is_refused() -> None:
    with pytest.raises(ValueError, match=r"frozenlake.*no demo_variants"):
        teacher_jobs([HARD], "frozenlake", tool_fraction=0.4, easy_tool_fraction=0.4)


def test_each_turn_is_weighted_by_its_rollout_s_share() -> None:
    records = [
        TurnRecord(task_id="t", traj_id="w-0000-v0", turn=0),
        TurnRecord(task_id="t", traj_id="w-0000-v0", turn=1),
        TurnRecord(task_id="t", traj_id="w-0000-v1", turn=0),
    ]
    examples = [TurnExample([1], [2]), TurnExample([1, 2], [3]), TurnExample([1], [4])]
    weighted = weighted_examples(examples, records, {"w-0000-v0": 0.4, "w-0000-v1": 0.6})
    assert [e.weight for e in weighted] == [0.4, 0.4, 0.6]
    assert [e.response for e in weighted] == [[2], [3], [4]]
    with pytest.raises(ValueError, match="2 examples for 3 records"):
        weighted_examples(examples[:2], records, {})


def test_the_calculator_teacher_follows_the_variant() -> None:
    teacher = calc_teacher()
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {}}}]
    messages = [{"role": "user", "content": "2+3"}]
    easy = dict(EASY.payload, tags=["easy"])
    with_tool = teacher.teach(messages, tools, {**easy, DEMO_KEY: {"use_tool": True}})
    assert with_tool["tool_calls"][0]["function"]["arguments"] == '{"input": "2+3"}'
    direct = teacher.teach(messages, tools, {**easy, DEMO_KEY: {"use_tool": False}})
    assert direct == {"role": "assistant", "content": "5"}
    assert teacher.teach(messages, tools, easy) == direct  # per task: never on easy ones
    assert demo_options({DEMO_KEY: {"use_tool": True}}) == {"use_tool": True}
    assert demo_options({}) is None
