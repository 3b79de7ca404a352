"""The agent teacher's tool share per kind of problem, demonstrated per draw.

The built-in warm start's ``mix = "per_draw"`` (:mod:`turnrl.train.update.sft`) keeps every
demonstration variant of every task, each turn weighted by the variant's
probability, so a task's target is the mixture itself. The agent loop reaches the
same mix through its teacher: with ``warm_start.mix = "per_draw"`` each teacher
task is run once per variant the task environment's ``demo_variants`` lists (on
the calculator: the tool with probability ``tool_fraction`` on hard problems and
``easy_tool_fraction`` on easy ones, a direct answer otherwise), the variant's
options handed to the teacher in the task under :data:`DEMO_KEY`, and each
recorded turn weighted by the variant's probability. The teacher reads the
options (``examples/agents/calc_teacher.py``); with ``mix = "per_task"`` it gets
none and decides by itself, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from turnrl.envs import get_env_spec
from turnrl.train.update.sft import TurnExample
from turnrl.types import Task, TurnRecord

DEMO_KEY = "demo"
"""The task field that carries a variant's options to the teacher (``{"use_tool": bool}``
on the calculator)."""


def teacher_jobs(
    tasks: Sequence[Task],
    env_name: str,
    *,
    tool_fraction: float,
    easy_tool_fraction: float,
    prefix: str = "w-",
) -> list[tuple[str, Task, float]]:
    """``(rollout_id, task, probability)``: one rollout per variant of each task, the
    task's payload carrying the variant's options under :data:`DEMO_KEY`.

    ``env_name`` names the built-in environment whose ``demo_variants`` define the
    variants (``tasks.train``); ids are ``{prefix}{slot:04d}-v{variant}``.
    """
    variants = get_env_spec(env_name).demo_variants
    if variants is None:
        raise ValueError(f"environment {env_name!r} has no demo_variants for mix='per_draw'")
    jobs = []
    for slot, task in enumerate(tasks):
        for index, (probability, options) in enumerate(
            variants(task, tool_fraction, easy_tool_fraction)
        ):
            payload = {**task.payload, DEMO_KEY: dict(options)}
            jobs.append(
                (f"{prefix}{slot:04d}-v{index}", replace(task, payload=payload), probability)
            )
    return jobs


def weighted_examples(
    examples: Sequence[TurnExample],
    records: Sequence[TurnRecord],
    probability_by_rollout: dict[str, float],
) -> list[TurnExample]:
    """``examples`` (one per record, in order) weighted by their rollout's probability."""
    if len(examples) != len(records):
        raise ValueError(f"{len(examples)} examples for {len(records)} records")
    return [
        replace(example, weight=probability_by_rollout[record.traj_id])
        for example, record in zip(examples, records, strict=True)
    ]


def demo_options(task: dict[str, Any]) -> dict[str, Any] | None:
    """The variant options a per-draw teacher task carries, or None (per-task mix)."""
    options = task.get(DEMO_KEY)
    return dict(options) if isinstance(options, dict) else None
