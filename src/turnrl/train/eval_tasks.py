"""The tasks an evaluation runs on: a task file, or the config's own held-out tasks.

A task file is JSONL (one JSON object per line, as ``tasks.train`` files: a
``task_id``, optional ``tags``) or Parquet (one row per task, the same columns; read
with ``pyarrow`` when it is installed). For an agent program the whole object is the
task it receives; for an environment it is the task's payload beside ``task_id`` and
``tags`` (what the environment's own ``make_tasks`` puts there: a calculator task is
``{"task_id", "tags", "question", "expression", "answer"}``), and every payload field
of the environment's own tasks must be present. Errors name the file, the line (the
row for Parquet) and the field.

Without a file: the environment's held-out tasks (``env.seed``, ``env.n_eval_tasks``:
:func:`~turnrl.train.task_split.task_split`), or the agent loop's (``tasks.eval``, else
``tasks.train``, ``tasks.n_eval`` from the derived seed): the tasks the run evaluated on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from turnrl.train.agent.tasks import TaskFileError, load_tasks, read_task_file, task_from_dict
from turnrl.train.seeds import derive_seed
from turnrl.types import Task

__all__ = ["agent_eval_tasks", "env_tasks", "read_tasks"]

TASK_KEYS = ("task_id", "tags")
"""The fields of a task file's line that are not an environment task's payload."""


def agent_eval_tasks(tasks: Any) -> list[Task]:
    """The agent loop's held-out tasks from its ``[tasks]`` section."""
    return load_tasks(
        tasks.eval if tasks.eval is not None else tasks.train,
        n=tasks.n_eval,
        seed=derive_seed(tasks.seed, "eval_tasks"),
        kwargs=tasks.kwargs,
    )


def read_tasks(path: str | Path) -> tuple[list[Task], list[str]]:
    """The tasks of a JSONL or Parquet file, and where each one is (``FILE:LINE`` or
    ``FILE: row N``) for later errors."""
    source = str(path)
    if source.endswith(".parquet"):
        return _read_parquet(path)
    tasks = read_task_file(path)
    text = Path(path).read_text(encoding="utf-8")
    lines = [n for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    return tasks, [f"{source}:{n}" for n in lines]


def _read_parquet(path: str | Path) -> tuple[list[Task], list[str]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TaskFileError(
            f"{path}: reading a Parquet task file needs pyarrow (pip install pyarrow); "
            "or write the tasks as JSONL"
        ) from None
    try:
        rows = pq.read_table(path).to_pylist()
    except (OSError, ValueError) as exc:
        raise TaskFileError(f"{path}: cannot read the Parquet file: {exc}") from None
    if not rows:
        raise TaskFileError(f"{path}: no tasks (the file has no rows)")
    where = [f"{path}: row {n}" for n in range(1, len(rows) + 1)]
    tasks = [task_from_dict(row, at) for row, at in zip(rows, where, strict=True)]
    seen: dict[str, str] = {}
    for task, at in zip(tasks, where, strict=True):
        if task.task_id in seen:
            raise TaskFileError(
                f"{at}: field 'task_id': {task.task_id!r} repeats {seen[task.task_id]}"
            )
        seen[task.task_id] = at
    return tasks, where


def env_tasks(tasks: list[Task], where: list[str], env_name: str, example: Task) -> list[Task]:
    """File tasks as tasks of the environment ``env_name``: the payload without
    ``task_id`` and ``tags``, which must hold every field of ``example`` (one of the
    environment's own tasks)."""
    out = []
    for task, at in zip(tasks, where, strict=True):
        payload = {k: v for k, v in task.payload.items() if k not in TASK_KEYS}
        missing = [k for k in example.payload if k not in payload]
        if missing:
            raise TaskFileError(
                f"{at}: field {missing[0]!r}: missing (a {env_name} task has "
                f"{', '.join(repr(k) for k in (*TASK_KEYS, *example.payload))})"
            )
        out.append(Task(task.task_id, payload, task.tags))
    return out
