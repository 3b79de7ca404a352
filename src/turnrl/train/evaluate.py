"""The held-out evaluation, one function per way in: what the trainers log and what
``turnrl eval`` reports are the same episodes and the same numbers.

* :func:`evaluate_in_env`: a policy on a built-in (or user) environment's tasks,
  ``samples`` episodes per task at ``temperature`` (0: greedy), with the batch seed
  fixed at 0 so that the same weights on the same tasks give the same episodes
  wherever they run (the environment trainer's ``evaluate`` and ``turnrl eval``);
* :func:`evaluate_agents`: an agent program through a gateway serving the policy,
  ``samples`` rollouts per task (the agent loop's ``evaluate`` and ``turnrl eval``
  with ``[agent]``).

Both return an :class:`Evaluation`: the per-episode summaries the metrics read, the
turn records, and :attr:`Evaluation.metrics`, the ``eval_*`` keys a run's metrics
row holds (:func:`turnrl.train.metrics.episode_metrics`, or the agent loop's
:func:`~turnrl.train.agent.rollouts.rollout_metrics`). ``turnrl eval``'s further
statistics (pass@k, success by route, tokens) are computed from the same episodes
(:mod:`turnrl.train.eval_summary`); they never replace these.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnrl.rollout import run_episodes
from turnrl.rollout.context_cap import cap_context
from turnrl.rollout.tokens import PrefixReuse
from turnrl.train.agent.rollouts import RolloutSummary, plan_rollouts, rollout_metrics
from turnrl.train.agent.runner import AgentRunner, RolloutResult
from turnrl.train.metrics import EpisodeSummary, episode_metrics
from turnrl.types import Env, Task, TurnRecord

__all__ = ["EVAL_PREFIX", "Evaluation", "evaluate_agents", "evaluate_in_env"]

EVAL_PREFIX = "eval_"
"""The prefix of every evaluation metric in a run's metrics rows."""

EVAL_SEED = 0
"""The sampling seed of every evaluation batch (only matters at a temperature above 0)."""


@dataclass(frozen=True)
class Evaluation:
    """One evaluation: its episodes (one per rollout that finished), their turn records
    and the metrics a run logs for it."""

    episodes: Sequence[EpisodeSummary]
    """Per episode: task, success, tool calls, turns, outcome (in rollout order)."""
    traj_ids: Sequence[str]
    """The rollout id of each episode (same order)."""
    records: Sequence[TurnRecord]
    """Every turn of the finished episodes."""
    metrics: dict[str, float]
    """The ``eval_*`` keys of the run's metrics row."""
    failures: int = 0
    """Agent rollouts that failed (never counted as episodes; 0 in an environment)."""


def evaluate_in_env(
    sampler: Any,
    make_env: Callable[[], Env],
    tasks: Sequence[Task],
    *,
    samples: int,
    temperature: float,
    max_new_tokens: int,
    max_context_tokens: int | None = None,
) -> Evaluation:
    """``samples`` episodes per task of ``sampler`` (a policy, or a vLLM engine holding
    its weights) in fresh environments from ``make_env``; earlier turns and the shared
    prompt are encoded once (:class:`~turnrl.rollout.tokens.PrefixReuse`). The caller
    puts a learner in eval mode first. ``max_context_tokens``: the run's per-turn context
    cap (``rollout.max_context_tokens``, :mod:`turnrl.rollout.context_cap`), as in training."""
    batch = run_episodes(
        PrefixReuse(cap_context(sampler, max_context_tokens)),
        make_env,
        list(tasks),
        group_size=samples,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=EVAL_SEED,
        traj_prefix="eval-",
    )
    return Evaluation(
        episodes=batch.episodes,
        traj_ids=[e.traj_id for e in batch.episodes],
        records=batch.records,
        metrics=episode_metrics(batch.episodes, prefix=EVAL_PREFIX),
    )


def evaluate_agents(
    runner: AgentRunner,
    tasks: Sequence[Task],
    *,
    samples: int,
    prefix: str,
    failure_dir: Path,
    check: Callable[[list[RolloutResult]], None] | None = None,
) -> Evaluation:
    """``samples`` rollouts per task of the agent ``runner`` runs against its gateway
    (rollout ids ``PREFIX0000-0``...; failures' details under ``failure_dir``).
    ``check`` sees every result first (the agent loop's failure log and limit)."""
    jobs = plan_rollouts(list(tasks), samples, prefix)
    results = runner.run(jobs, failure_dir=failure_dir)
    if check is not None:
        check(results)
    kept = [r for r in results if r.failure is None]
    return Evaluation(
        episodes=[RolloutSummary.of(r) for r in kept],
        traj_ids=[r.rollout_id for r in kept],
        records=[record for r in kept for record in r.records],
        metrics=rollout_metrics(results, prefix=EVAL_PREFIX),
        failures=len(results) - len(kept),
    )
