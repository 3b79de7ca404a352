"""Per-step metrics of a rollout batch and its credit (pure numpy).

Besides success and advantage statistics, every step's row carries the diagnostics that
show credit drifting away from exact baselines (the #489 pattern) while it happens, so
that ``metrics.jsonl`` and the trackers (:mod:`turnrl.train.trackers`) plot them:

``mixed_group_frac``
    share of the estimator's groups (with two or more members) whose members were sampled
    from different decision points (:func:`turnrl.credit.audit.audit_group_key`);
``zero_adv_group_frac``
    share of groups in which every member gets advantage 0 (no learning signal);
``adv_mean_turn0``, ``adv_mean_turn1``, ``adv_mean_turn2plus``
    mean advantage by turn position;
``tool_rate_<kind>``
    tool-call rate by task kind (:func:`episode_metrics`, per task tag);
``context_rebuilt_frac``
    share of turns whose context the gateway had to rebuild (agent runs; records that say);
``staleness_mean``, ``staleness_max``
    how many policy versions behind the learner the turns were sampled (records that carry
    ``policy_version``: agent runs; environment runs sample with the learner's weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from turnrl.credit.audit import audit_group_key
from turnrl.credit.registry import get_estimator
from turnrl.table import TurnTable
from turnrl.types import Task

TURN_POSITIONS = 3
"""Advantage statistics are logged for turns 0..TURN_POSITIONS-1 and pooled after."""


class EpisodeSummary(Protocol):
    """What :func:`episode_metrics` reads of an episode: a rollout runner's ``Episode``,
    or the agent loop's summary of a rollout recorded by the gateway."""

    task: Task
    correct: bool | None
    outcome: float
    turn: int
    tool_calls: int
    opened_with_tool: bool | None
    malformed: int
    truncated_responses: int


def episode_metrics(episodes: Sequence[EpisodeSummary], prefix: str = "") -> dict[str, float]:
    """Success, tool-call rate (any call; ``tool_open_rate``: a call at turn 0), tool calls
    and turns per episode, overall and per task tag; and the turn-0 choice's economics:
    ``opened_tool_success`` (success of the episodes that called a tool at turn 0) and
    ``opened_no_tool_success`` (of the others: a direct answer, or a malformed first turn),
    each absent when no episode opened that way."""
    out: dict[str, float] = {}

    def add(suffix: str, group: Sequence[EpisodeSummary]) -> None:
        if not group:
            return
        out[f"{prefix}success{suffix}"] = float(np.mean([bool(e.correct) for e in group]))
        out[f"{prefix}tool_rate{suffix}"] = float(np.mean([e.tool_calls > 0 for e in group]))
        out[f"{prefix}tool_open_rate{suffix}"] = float(
            np.mean([bool(e.opened_with_tool) for e in group])
        )
        out[f"{prefix}tool_calls{suffix}"] = float(np.mean([e.tool_calls for e in group]))
        out[f"{prefix}turns{suffix}"] = float(np.mean([e.turn for e in group]))
        out[f"{prefix}return{suffix}"] = float(np.mean([e.outcome for e in group]))
        # the economics of the turn-0 choice: how often each opening ends right
        for name, opened in (("tool", True), ("no_tool", False)):
            chose = [bool(e.correct) for e in group if bool(e.opened_with_tool) is opened]
            if chose:
                out[f"{prefix}opened_{name}_success{suffix}"] = float(np.mean(chose))

    add("", episodes)
    tags = sorted({tag for e in episodes for tag in e.task.tags})
    for tag in tags:
        add(f"_{tag}", [e for e in episodes if tag in e.task.tags])
    turns = sum(e.turn for e in episodes)
    out[f"{prefix}malformed_rate"] = sum(e.malformed for e in episodes) / max(turns, 1)
    out[f"{prefix}truncated_rate"] = sum(e.truncated_responses for e in episodes) / max(turns, 1)
    return out


def advantage_metrics(
    table: TurnTable,
    advantages: np.ndarray,
    estimator: str,
    *,
    learner_version: int | None = None,
) -> dict[str, Any]:
    """Advantage mean/std by turn position, zero-advantage and mixed groups of the
    estimator's group key, rebuilt contexts and (given the ``learner_version`` the update
    starts from) staleness; see the module docstring."""
    out: dict[str, Any] = {}
    position = np.minimum(table.turn, TURN_POSITIONS - 1)
    for t in range(TURN_POSITIONS):
        values = advantages[position == t]
        if values.size:
            label = f"{t}" if t < TURN_POSITIONS - 1 else f"{t}plus"
            out[f"adv_mean_turn{label}"] = float(values.mean())
            out[f"adv_std_turn{label}"] = float(values.std())
    groups = audit_group_key(table, get_estimator(estimator).group_key, advantages)
    out["zero_adv_group_frac"] = groups.zero_adv_share if groups.n_groups else 0.0
    out["mixed_group_frac"] = groups.mixed_share if groups.n_groups else 0.0
    out["adv_abs_mean"] = float(np.abs(advantages).mean())
    out.update(record_metrics(table.records or [], learner_version))
    return out


def record_metrics(records: Sequence[Any], learner_version: int | None) -> dict[str, float]:
    """``context_rebuilt_frac`` over the records that say whether their context was
    rebuilt; ``staleness_mean``/``_max`` (``learner_version`` minus each record's
    ``policy_version``) over those that carry one. Absent when no record says."""
    out: dict[str, float] = {}
    rebuilt = [r.context_rebuilt for r in records if r.context_rebuilt is not None]
    if rebuilt:
        out["context_rebuilt_frac"] = float(np.mean(rebuilt))
    versions = [r.policy_version for r in records if r.policy_version is not None]
    if versions and learner_version is not None:
        lag = learner_version - np.asarray(versions)
        out["staleness_mean"] = float(lag.mean())
        out["staleness_max"] = float(lag.max())
    return out
