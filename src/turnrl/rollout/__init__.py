"""Rollouts: run a policy in environments and write exact turn records.

Strategies, by name (``rollout.strategy``): ``independent``, and the tree
strategies ``patr``, ``rtpo`` and ``atgrpo`` (see docs/tree-rollouts.md).
"""

from turnrl.rollout import atgrpo, patr, rtpo  # noqa: F401  (registers the tree strategies)
from turnrl.rollout.runner import (
    Episode,
    RolloutBatch,
    continue_episodes,
    run_episodes,
    start_episode,
    step_episodes,
)
from turnrl.rollout.scorers import ValueScorer, make_scorer, register_heuristic, register_scorer
from turnrl.rollout.strategies import (
    StepExperience,
    StrategyContext,
    get_strategy,
    register_strategy,
    strategy_params,
)
from turnrl.rollout.tokens import PrefixReuse, token_metrics

__all__ = [
    "Episode",
    "PrefixReuse",
    "RolloutBatch",
    "StepExperience",
    "StrategyContext",
    "ValueScorer",
    "continue_episodes",
    "get_strategy",
    "make_scorer",
    "register_heuristic",
    "register_scorer",
    "register_strategy",
    "run_episodes",
    "start_episode",
    "step_episodes",
    "strategy_params",
    "token_metrics",
]
