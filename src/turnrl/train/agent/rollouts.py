"""The agent loop's rollouts as data: their ids, what the metrics read of a finished
one, and which ones may not be trained on (:mod:`turnrl.train.agent.loop`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from turnrl.rollout.success import success_flag
from turnrl.train.agent.runner import AgentFailure, RolloutResult
from turnrl.train.metrics import episode_metrics
from turnrl.types import Task


def plan_rollouts(tasks: list[Task], group_size: int, prefix: str) -> list[tuple[str, Task]]:
    """``(rollout_id, task)`` of ``group_size`` rollouts per task; ids are unique in a run
    (``prefix`` names the step) and safe in a URL path."""
    return [
        (f"{prefix}{slot:04d}-{g}", task)
        for slot, task in enumerate(tasks)
        for g in range(group_size)
    ]


@dataclass
class RolloutSummary:
    """What the metrics read of one finished rollout (the fields of an environment episode)."""

    task: Task
    outcome: float
    correct: bool
    turn: int
    tool_calls: int
    opened_with_tool: bool
    truncated_responses: int
    malformed: int = 0
    roles: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, result: RolloutResult) -> RolloutSummary:
        records = result.records
        success = success_flag(result.info.get("success"), "info.success")  # checked
        roles: dict[str, int] = {}
        for record in records:
            roles[record.role] = roles.get(record.role, 0) + 1
        return cls(
            task=result.task,
            # the return trained on: the agent's reward less the turns' cost
            outcome=result.reward - result.turn_cost * len(records),
            correct=bool(success) if success is not None else result.reward > 0,
            turn=len(records),
            tool_calls=sum(bool(r.tool_call) for r in records),
            opened_with_tool=bool(records and records[0].tool_call),
            truncated_responses=sum(r.stop_reason == "length" for r in records),
            roles=roles,
        )


def rollout_metrics(results: list[RolloutResult], prefix: str = "") -> dict[str, float]:
    """Success, tool-call rate, calls and return per rollout, overall and per task tag;
    calls per role when there are several; failed rollouts."""
    kept = [RolloutSummary.of(r) for r in results if r.failure is None]
    out = episode_metrics(kept, prefix=prefix) if kept else {}
    out.pop(f"{prefix}malformed_rate", None)  # the gateway cannot tell a malformed reply
    roles = sorted({role for s in kept for role in s.roles})
    if len(roles) > 1:
        for role in roles:
            out[f"{prefix}turns_{role}"] = float(np.mean([s.roles.get(role, 0) for s in kept]))
    out[f"{prefix}agent_failures"] = float(sum(r.failure is not None for r in results))
    return out


def refuse_untrainable(
    results: list[RolloutResult],
    temperature: float,
    *,
    learner_version: int | None = None,
    max_staleness: int = 0,
) -> None:
    """Turn rollouts that must not be trained on into failures: sampled by two policy
    versions in a synchronous loop (``max_staleness`` 0: impossible, so a bug), or, with
    partial rollouts (``max_staleness`` K >= 1), by a version more than K behind the
    ``learner_version`` the update starts from (impossible under the admission schedule);
    or at a temperature other than the one the update recomputes log-probs at."""
    for result in results:
        if result.failure is not None:
            continue
        versions = sorted({r.policy_version for r in result.records})
        temperatures = sorted({r.temperature for r in result.records})
        reason = None
        if max_staleness == 0 and len(versions) > 1:
            reason = f"its turns were sampled by policy versions {versions}"
        elif (
            max_staleness > 0
            and learner_version is not None
            and versions
            and versions[0] < learner_version - max_staleness
        ):
            reason = (
                f"its turns were sampled by policy versions {versions}, more than "
                f"train.max_staleness={max_staleness} behind the learner's {learner_version}"
            )
        elif any(not math.isclose(t, temperature) for t in temperatures):
            reason = (
                f"the agent asked for temperature {temperatures}, but training samples at "
                f"policy.temperature={temperature} (drop the agent's temperature argument)"
            )
        if reason is not None:
            result.failure = AgentFailure(result.rollout_id, result.task.task_id, reason, None)
            result.records = []
