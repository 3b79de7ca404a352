"""Per-step metrics of a rollout batch and its credit (pure numpy)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from turnrl.credit.groups import group_codes
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
    and turns per episode, overall and per task tag."""
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

    add("", episodes)
    tags = sorted({tag for e in episodes for tag in e.task.tags})
    for tag in tags:
        add(f"_{tag}", [e for e in episodes if tag in e.task.tags])
    turns = sum(e.turn for e in episodes)
    out[f"{prefix}malformed_rate"] = sum(e.malformed for e in episodes) / max(turns, 1)
    out[f"{prefix}truncated_rate"] = sum(e.truncated_responses for e in episodes) / max(turns, 1)
    return out


def advantage_metrics(table: TurnTable, advantages: np.ndarray, estimator: str) -> dict[str, Any]:
    """Advantage mean/std by turn position, what later turns receive, zero-advantage groups."""
    out: dict[str, Any] = {}
    position = np.minimum(table.turn, TURN_POSITIONS - 1)
    for t in range(TURN_POSITIONS):
        values = advantages[position == t]
        if values.size:
            label = f"{t}" if t < TURN_POSITIONS - 1 else f"{t}plus"
            out[f"adv_mean_turn{label}"] = float(values.mean())
            out[f"adv_std_turn{label}"] = float(values.std())
    codes, n_groups = group_codes(table, get_estimator(estimator).group_key)
    valid = codes >= 0
    nonzero = np.bincount(
        codes[valid], weights=np.abs(advantages[valid]) > 1e-12, minlength=n_groups
    )
    present = np.bincount(codes[valid], minlength=n_groups) > 0
    out["zero_adv_group_frac"] = float((nonzero[present] == 0).mean()) if present.any() else 0.0
    out["adv_abs_mean"] = float(np.abs(advantages).mean())
    return out
