"""Iterative GRPO's deploy step: the current policy on a batch of tasks, logged.

Each task's conversations are split over ``deploy.temperatures`` x
``deploy.personas`` (:func:`deployment_arms`; exploration,
:mod:`turnrl.train.iterate.explore`) and run with the environment trainer's
rollout runner (:func:`turnrl.rollout.run_episodes`), so every turn is a record
with exact tokens. See :mod:`turnrl.train.iterate.loop` for the whole iteration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from turnrl.policy.trainable import TrainablePolicy
from turnrl.rollout import RolloutBatch, run_episodes
from turnrl.train.iterate.config import DeployConfig
from turnrl.train.iterate.explore import hide_personas, persona_env_factory
from turnrl.train.run import (
    derive_seed,
)
from turnrl.types import Env, Task


def merge_batches(batches: Sequence[RolloutBatch]) -> RolloutBatch:
    """One batch with the records, episodes and costs of several."""
    merged = RolloutBatch(records=[], episodes=[])
    for batch in batches:
        merged.records.extend(batch.records)
        merged.episodes.extend(batch.episodes)
        merged.sampled_tokens += batch.sampled_tokens
        merged.context_tokens += batch.context_tokens
        merged.seconds_sampling += batch.seconds_sampling
        merged.seconds_env += batch.seconds_env
    return merged


def temperature_counts(conversations: int, temperatures: Sequence[float]) -> list[int]:
    """Conversations per task at each temperature (as even as possible, earlier first)."""
    if not temperatures:
        raise ValueError("deploy.temperatures must list at least one temperature")
    base, extra = divmod(conversations, len(temperatures))
    return [base + (1 if j < extra else 0) for j in range(len(temperatures))]


def deployment_arms(cfg: DeployConfig) -> list[tuple[float, int, int]]:
    """``(temperature, persona index, conversations per task)`` of each deployment arm.

    Conversations are split evenly over every (temperature, persona) pair, in
    ``temperatures``-major order; ``personas`` defaults to the plain policy only.
    """
    if not cfg.personas:
        raise ValueError('deploy.personas must list at least one entry ("" = no persona)')
    pairs = [(t, p) for t in cfg.temperatures for p in range(len(cfg.personas))]
    counts = temperature_counts(cfg.conversations_per_task, [t for t, _ in pairs])
    return [(t, p, n) for (t, p), n in zip(pairs, counts, strict=True)]


def deploy(
    policy: TrainablePolicy,
    make_env_fn: Callable[[], Env],
    tasks: Sequence[Task],
    cfg: DeployConfig,
    *,
    max_new_tokens: int,
    seed: int,
    prefix: str,
) -> RolloutBatch:
    """Collect ``conversations_per_task`` conversations per task, split over
    temperatures and exploration personas (:mod:`turnrl.train.iterate.explore`).

    Records carry the ``temperature`` they were sampled at and their ``persona``
    index; persona instructions are removed from the logged ``prompt_ids``.
    """
    policy.model.eval()
    batches = []
    for j, (temperature, persona, count) in enumerate(deployment_arms(cfg)):
        if count == 0:
            continue
        batch = run_episodes(
            policy,
            persona_env_factory(make_env_fn, cfg.personas[persona]),
            list(tasks),
            group_size=count,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=derive_seed(seed, "deploy_arm", j),
            traj_prefix=f"{prefix}t{j}-",
        )
        hide_personas(policy, batch, persona)
        batch.records = [
            dataclasses.replace(r, temperature=float(temperature)) for r in batch.records
        ]
        batches.append(batch)
    return merge_batches(batches)
