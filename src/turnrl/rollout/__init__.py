"""Rollouts: run a policy in environments and write exact turn records."""

from turnrl.rollout.runner import Episode, RolloutBatch, continue_episodes, run_episodes

__all__ = ["Episode", "RolloutBatch", "continue_episodes", "run_episodes"]
