"""Rollouts: run a policy in environments and write exact turn records."""

from turnrl.rollout.runner import Episode, RolloutBatch, continue_episodes, run_episodes
from turnrl.rollout.strategies import (
    StepExperience,
    StrategyContext,
    get_strategy,
    register_strategy,
    strategy_params,
)

__all__ = [
    "Episode",
    "RolloutBatch",
    "StepExperience",
    "StrategyContext",
    "continue_episodes",
    "get_strategy",
    "register_strategy",
    "run_episodes",
    "strategy_params",
]
