"""Task sets of the agent loop: JSONL files (strictly read) and built-in sets by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnrl.envs.calculator import calculator_tasks
from turnrl.train.agent.tasks import (
    TaskFileError,
    calculator_task_set,
    check_task_spec,
    load_tasks,
    read_task_file,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_task_file_is_read_whole_in_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"task_id": "a/1", "question": "Q1", "tags": ["hard"]}\n\n{"task_id": "b", "x": [1]}\n',
    )
    tasks = load_tasks(str(path), n=99, seed=5)
    assert [t.task_id for t in tasks] == ["a/1", "b"]
    assert tasks[0].payload == {"task_id": "a/1", "question": "Q1", "tags": ["hard"]}
    assert tasks[0].tags == ("hard",)
    assert tasks[1].payload == {"task_id": "b", "x": [1]}
    assert tasks[1].tags == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"task_id": "a"}\n{"task_id": "a"}\n', ":2: field 'task_id': 'a' repeats line 1"),
        ('{"task_id": "a"}\n{"task_id": \n', ":2: malformed JSON (Expecting value)"),
        ('{"task_id": "a", "x": NaN}\n', ":1: malformed JSON (NaN is not valid JSON)"),
        ('["task_id"]\n', ":1: a task must be a JSON object, got list"),
        ('{"question": "Q"}\n', ":1: field 'task_id': task_id must be 1 to 256 printable"),
        ('{"task_id": "a b"}\n', ":1: field 'task_id': task_id must be 1 to 256 printable"),
        ('{"task_id": "a", "tags": "hard"}\n', ":1: field 'tags': must be a list of strings"),
        ("\n\n", ": no tasks (the file is empty)"),
    ],
)
def test_bad_task_files_name_file_line_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(TaskFileError) as error:
        read_task_file(path)
    assert str(error.value).startswith(f"{path}{message}")


def test_the_builtin_calculator_set_is_the_environment_s_problems() -> None:
    tasks = calculator_task_set(6, seed=3, hard_fraction=0.5)
    env_tasks = calculator_tasks(6, 3, 0.5)
    assert [t.task_id for t in tasks] == [t.task_id for t in env_tasks]
    for task, env_task in zip(tasks, env_tasks, strict=True):
        assert task.payload["question"] == env_task.payload["question"]
        assert task.payload["expression"] == env_task.payload["expression"]
        assert task.payload["answer"] == float(env_task.payload["answer"])
        assert isinstance(task.payload["answer"], int)
        assert task.payload["tags"] == list(env_task.tags)
    assert sum("hard" in t.tags for t in tasks) == 3
    assert load_tasks("calculator", n=6, seed=3, kwargs={"hard_fraction": 0.5}) == tasks


def test_task_specs_are_checked_before_any_work(tmp_path: Path) -> None:
    check_task_spec("calculator", "tasks.train")
    with pytest.raises(ValueError, match=r"tasks\.train: unknown built-in task set .calculater."):
        check_task_spec("calculater", "tasks.train")
    with pytest.raises(ValueError, match=r"tasks\.eval: task file .nope\.jsonl. does not exist"):
        check_task_spec("nope.jsonl", "tasks.eval")
    with pytest.raises(TaskFileError, match="cannot read the task file"):
        read_task_file(tmp_path / "missing.jsonl")
