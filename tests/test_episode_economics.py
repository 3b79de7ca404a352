"""The turn-0 choice's economics in ``episode_metrics``: how often an episode that opened
with a tool call ended right, and how often one that did not, on hand-built episodes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from turnrl.train.metrics import episode_metrics
from turnrl.types import Task


@dataclass
class Ep:
    task: Task
    correct: bool | None
    opened_with_tool: bool | None
    outcome: float = 0.0
    turn: int = 1
    tool_calls: int = 0
    malformed: int = 0
    truncated_responses: int = 0


HARD = Task("h", {}, ("hard",))
EASY = Task("e", {}, ("easy",))


def test_success_by_opening_overall_and_per_tag() -> None:
    episodes = [
        Ep(HARD, True, True),  # hard: tool 2 of 2 right, no tool 0 of 1
        Ep(HARD, True, True),
        Ep(HARD, False, False),
        Ep(EASY, True, True),  # easy: tool 1 of 1 right
        Ep(EASY, True, False),  # easy: no tool 1 of 3 right (None counts as wrong)
        Ep(EASY, None, False),
        Ep(EASY, False, None),  # a malformed first turn: not a tool opening
    ]
    m = episode_metrics(episodes, prefix="eval_")
    assert m["eval_opened_tool_success"] == 3 / 3
    assert m["eval_opened_no_tool_success"] == pytest.approx(1 / 4)
    assert m["eval_opened_tool_success_hard"] == 1.0
    assert m["eval_opened_no_tool_success_hard"] == 0.0
    assert m["eval_opened_tool_success_easy"] == 1.0
    assert m["eval_opened_no_tool_success_easy"] == pytest.approx(1 / 3)
    # the two shares recombine to the overall success
    share = m["eval_tool_open_rate"]
    assert share == pytest.approx(3 / 7)
    recombined = share * m["eval_opened_tool_success"]
    recombined += (1 - share) * m["eval_opened_no_tool_success"]
    assert recombined == pytest.approx(m["eval_success"])


def test_an_opening_no_episode_took_is_absent() -> None:
    m = episode_metrics([Ep(EASY, True, False), Ep(EASY, False, False)])
    assert m["opened_no_tool_success"] == 0.5
    assert "opened_tool_success" not in m
    assert "opened_tool_success_easy" not in m
