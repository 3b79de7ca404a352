"""Task sets for user agent programs: a JSONL file, or a built-in set by name.

A task is one JSON object with a ``task_id`` (the grouping key of the credit
estimators: every rollout of one task shares it); the whole object is what the
agent receives as ``task``. An optional ``tags`` list labels the task for the
metrics (``success_hard``, ``tool_rate_hard``...), like the built-in
environments' tags.

``tasks.train = "path/to/train.jsonl"`` reads a file (a value ending in
``.jsonl`` or containing a path separator is a path); any other value names a
built-in set (:data:`BUILTIN_TASK_SETS`), generated deterministically from a
seed so that evaluation sets come from another seed than training sets.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from turnrl.envs.calculator import calculator_tasks
from turnrl.errors import TurnrlError
from turnrl.serve import GatewayError
from turnrl.serve.limits import check_id
from turnrl.types import Task


class TaskFileError(TurnrlError, ValueError):
    """A task file is unreadable or one of its lines is not a valid task."""


def task_from_dict(obj: Any, where: str) -> Task:
    """A :class:`Task` whose payload is the whole object ``obj``; ``where`` names it in errors."""
    if not isinstance(obj, dict):
        raise TaskFileError(f"{where}: a task must be a JSON object, got {type(obj).__name__}")
    task_id = obj.get("task_id")
    try:
        check_id(task_id, "task_id")
    except GatewayError as exc:
        raise TaskFileError(f"{where}: field 'task_id': {exc.message}") from None
    tags = obj.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise TaskFileError(f"{where}: field 'tags': must be a list of strings, got {tags!r}")
    return Task(task_id=task_id, payload=obj, tags=tuple(tags))


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def read_task_file(path: str | Path) -> list[Task]:
    """Every task of a JSONL file, in file order; errors name the file, line and field.

    Blank lines are skipped; duplicate ``task_id`` values and an empty file are errors
    (both would silently change what the run trains on).
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskFileError(f"{source}: cannot read the task file: {exc.strerror}") from None
    tasks: list[Task] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            obj = json.loads(line, parse_constant=_reject_constant)
        except (json.JSONDecodeError, ValueError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise TaskFileError(f"{where}: malformed JSON ({reason})") from None
        task = task_from_dict(obj, where)
        if task.task_id in first_line:
            raise TaskFileError(
                f"{where}: field 'task_id': {task.task_id!r} repeats line "
                f"{first_line[task.task_id]}"
            )
        first_line[task.task_id] = number
        tasks.append(task)
    if not tasks:
        raise TaskFileError(f"{source}: no tasks (the file is empty)")
    return tasks


def calculator_task_set(n: int, seed: int, **kwargs: Any) -> list[Task]:
    """The calculator environment's problems as agent tasks.

    Each task is ``{"task_id", "question", "expression", "answer", "tags"}``:
    ``answer`` is the exact result as a number (an int when it is whole), and
    ``tags`` is ``["easy"]`` or ``["hard"]`` (3-digit multiplications by default).
    ``kwargs`` go to :func:`turnrl.envs.calculator.calculator_tasks`
    (``hard_fraction``, ``word_fraction``, ``hard_digits``...).
    """
    tasks = []
    for task in calculator_tasks(n, seed, **kwargs):
        answer = float(task.payload["answer"])
        payload = {
            "task_id": task.task_id,
            "question": task.payload["question"],
            "expression": task.payload["expression"],
            "answer": int(answer) if math.isfinite(answer) and answer.is_integer() else answer,
            "tags": list(task.tags),
        }
        tasks.append(Task(task.task_id, payload, task.tags))
    return tasks


BUILTIN_TASK_SETS: dict[str, Callable[..., list[Task]]] = {
    "calculator": calculator_task_set,
}
"""Built-in task sets by name: ``fn(n, seed, **kwargs) -> list[Task]``."""


def is_task_file(spec: str) -> bool:
    """Whether a ``tasks.train``/``tasks.eval`` value names a file rather than a built-in set."""
    return spec.endswith(".jsonl") or "/" in spec or "\\" in spec


def check_task_spec(spec: str, option: str) -> None:
    """Fail early on a task source that cannot work: a missing file or an unknown set name."""
    if is_task_file(spec):
        if not Path(spec).is_file():
            raise ValueError(f"{option}: task file {spec!r} does not exist")
    elif spec not in BUILTIN_TASK_SETS:
        raise ValueError(
            f"{option}: unknown built-in task set {spec!r} (known: "
            f"{', '.join(sorted(BUILTIN_TASK_SETS))}; a file must end in .jsonl)"
        )


def load_tasks(spec: str, *, n: int, seed: int, kwargs: dict[str, Any] | None = None) -> list[Task]:
    """The tasks a ``tasks.train``/``tasks.eval`` value names.

    A file is read whole (``n`` and ``seed`` unused); a built-in set generates
    ``n`` tasks from ``seed`` with ``kwargs``.
    """
    if is_task_file(spec):
        return read_task_file(spec)
    check_task_spec(spec, "tasks")
    return BUILTIN_TASK_SETS[spec](n, seed, **(kwargs or {}))


def teacher_tasks(train_tasks: list[Task], teacher_count: int) -> list[Task]:
    """The training tasks the warm start's teacher demonstrates: the first
    ``teacher_count`` (``warm_start.teacher_tasks``; 0: all of them)."""
    return train_tasks[: teacher_count or len(train_tasks)]


def rl_tasks(train_tasks: list[Task], teacher_count: int, hold_out: bool) -> list[Task]:
    """The tasks RL draws from: every training task, or with ``hold_out``
    (``warm_start.hold_out_teacher_tasks``) those :func:`teacher_tasks` left out."""
    if not hold_out:
        return train_tasks
    if teacher_count <= 0:
        raise ValueError("holding the teacher's tasks out of RL needs teacher_tasks > 0")
    return train_tasks[teacher_count:]
