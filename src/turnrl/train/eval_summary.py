"""What ``turnrl eval`` reports beyond a run's ``eval_*`` metrics, from the same episodes.

* **pass@k** (Chen et al. 2021, "Evaluating Large Language Models Trained on Code",
  eq. 1): with ``n`` samples of a task of which ``c`` succeed, the unbiased estimate of
  the chance that at least one of ``k`` samples succeeds is ``1 - C(n-c, k) / C(n, k)``,
  computed as the paper's numerically stable product
  ``1 - prod_{i=n-c+1..n} (1 - k/i)``; the reported value is its mean over tasks. A
  task with fewer than ``k`` finished samples (an agent rollout that failed is no
  sample) has no estimate for that ``k`` and is left out of its mean.
* **routes**: each episode either called a tool (at least one parsed tool call) or
  answered directly; success is reported for each route with its share of episodes.
* **kinds**: the task tags (``easy``/``hard``...): every statistic per kind as well.
* **cost**: turns (policy calls) and sampled tokens (the response tokens of every
  turn) per episode.

Per task, :func:`task_rows` gives one JSON-ready row with every sample's outcome
(``turnrl eval``'s ``tasks.jsonl``); :func:`breakdown` the table of statistics by kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from turnrl.train.evaluate import Evaluation

__all__ = ["EpisodeOutcome", "breakdown", "episode_outcomes", "pass_at_k", "pass_ks", "task_rows"]

ALL = "all"
"""The breakdown's row over every episode (the kinds follow)."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from ``n`` samples with ``c`` successes (``k <= n``)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_ks(samples: int) -> list[int]:
    """The ``k`` values reported for ``samples`` samples per task: 1, the powers of two
    below ``samples``, and ``samples`` itself."""
    ks = {1, samples}
    k = 2
    while k < samples:
        ks.add(k)
        k *= 2
    return sorted(ks)


@dataclass(frozen=True)
class EpisodeOutcome:
    """One evaluated episode, as the reports read it."""

    task_id: str
    kinds: tuple[str, ...]
    traj_id: str
    success: bool
    reward: float
    turns: int
    tool_calls: int
    tokens: int

    @property
    def called(self) -> bool:
        """The episode's route: it called a tool (else it answered directly)."""
        return self.tool_calls > 0

    def as_json(self) -> dict[str, Any]:
        return {
            "traj_id": self.traj_id,
            "success": self.success,
            "reward": self.reward,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "tokens": self.tokens,
        }


def episode_outcomes(evaluation: Evaluation) -> list[EpisodeOutcome]:
    """Every episode of ``evaluation`` with its sampled tokens (from its turn records);
    success as the run's metrics count it (``bool(correct)``)."""
    tokens: dict[str, int] = {}
    for record in evaluation.records:
        tokens[record.traj_id] = tokens.get(record.traj_id, 0) + len(record.response_ids or ())
    return [
        EpisodeOutcome(
            task_id=e.task.task_id,
            kinds=tuple(e.task.tags),
            traj_id=traj_id,
            success=bool(e.correct),
            reward=float(e.outcome),
            turns=int(e.turn),
            tool_calls=int(e.tool_calls),
            tokens=tokens.get(traj_id, 0),
        )
        for e, traj_id in zip(evaluation.episodes, evaluation.traj_ids, strict=True)
    ]


def _by_task(outcomes: Sequence[EpisodeOutcome]) -> dict[str, list[EpisodeOutcome]]:
    tasks: dict[str, list[EpisodeOutcome]] = {}
    for outcome in outcomes:
        tasks.setdefault(outcome.task_id, []).append(outcome)
    return tasks


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def task_rows(outcomes: Sequence[EpisodeOutcome], ks: Sequence[int]) -> list[dict[str, Any]]:
    """One row per task (in first-seen order): its samples, successes, pass@k for each
    ``k`` its samples allow, tool-call rate, mean turns and tokens, and every sample."""
    rows = []
    for task_id, samples in _by_task(outcomes).items():
        n, c = len(samples), sum(s.success for s in samples)
        rows.append(
            {
                "task_id": task_id,
                "kinds": list(samples[0].kinds),
                "samples": n,
                "successes": c,
                "success": c / n,
                **{f"pass@{k}": pass_at_k(n, c, k) for k in ks if k <= n},
                "tool_call_rate": float(np.mean([s.called for s in samples])),
                "turns": float(np.mean([s.turns for s in samples])),
                "tokens": float(np.mean([s.tokens for s in samples])),
                "episodes": [s.as_json() for s in samples],
            }
        )
    return rows


def _statistics(group: Sequence[EpisodeOutcome], ks: Sequence[int]) -> dict[str, Any]:
    """The breakdown's columns over ``group`` (None where a statistic has no episode)."""
    per_task = _by_task(group)
    called = [o for o in group if o.called]
    direct = [o for o in group if not o.called]
    row: dict[str, Any] = {
        "tasks": len(per_task),
        "episodes": len(group),
        "success": _mean([o.success for o in group]),
    }
    for k in ks:
        estimates = [
            pass_at_k(len(s), sum(o.success for o in s), k)
            for s in per_task.values()
            if len(s) >= k
        ]
        row[f"pass@{k}"] = _mean(estimates)
    row.update(
        {
            "tool_call_rate": _mean([o.called for o in group]),
            "success_called": _mean([o.success for o in called]),
            "success_direct": _mean([o.success for o in direct]),
            "turns": _mean([o.turns for o in group]),
            "tokens": _mean([o.tokens for o in group]),
        }
    )
    return row


def breakdown(outcomes: Sequence[EpisodeOutcome], ks: Sequence[int]) -> dict[str, dict[str, Any]]:
    """Statistics over every episode (``"all"``) and per task kind (sorted): tasks,
    episodes, success, pass@k, tool-call rate, success when the episode called a tool
    and when it answered directly, turns and tokens per episode."""
    kinds = sorted({kind for o in outcomes for kind in o.kinds})
    table = {ALL: _statistics(outcomes, ks)}
    for kind in kinds:
        table[kind] = _statistics([o for o in outcomes if kind in o.kinds], ks)
    return table
