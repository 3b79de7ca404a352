"""``train.max_staleness``: which weight version samples each step, and which runs may
sample asynchronously (docs/async.md).

The schedule is fixed, not timing-dependent, so an asynchronous run is reproducible:
step ``n`` (its learner starts from version ``n - 1``, the updates done) samples with
version::

    sampling_version(n) = max(n - 1 - K, c(n))

where ``c(n)`` is the last checkpoint step before ``n`` (0 at the start). Admission
control is this formula: a step's rollout groups start only once the weights they must
be trained within ``K`` versions of exist, so no finished rollout is ever discarded for
staleness and a group is trained whole, in the step it was drawn for. The checkpoint
term makes the step after each checkpoint sample with the checkpoint's own weights:
nothing sampled from older weights is in flight across a checkpoint, so ``--resume``
re-creates exactly what the killed run would have sampled (at the cost of one
synchronous step per checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from turnrl.train.validate import Problems

__all__ = ["ASYNC_REFUSALS", "check_staleness", "sampling_version", "steps_sampled_with"]

ASYNC_REFUSALS = {
    "rtpo": "RTPO updates once per turn position inside a step and samples each position "
    "from the weights its previous update left (an on-policy refresh)",
    "patr": "PATR grows each tree with its process scorer on the current weights while it "
    "samples (a scorer refresh inside the step)",
    "atgrpo": "AT-GRPO picks the next turn among candidates sampled from the main "
    "trajectory's snapshot, one environment restored per candidate, in this process",
}
"""Why each tree strategy cannot sample in a separate process ahead of the learner."""


def sampling_version(step: int, max_staleness: int, is_checkpoint: Callable[[int], bool]) -> int:
    """The weight version (updates applied) step ``step`` samples with (module docstring)."""
    version = max(step - 1 - max_staleness, 0)
    for earlier in range(step - 1, version, -1):
        if is_checkpoint(earlier):
            return earlier
    return version


def steps_sampled_with(
    version: int, max_staleness: int, last_step: int, is_checkpoint: Callable[[int], bool]
) -> list[int]:
    """The steps (at most ``last_step``) that sample with ``version``, in order: those to
    request once ``version`` is pushed."""
    candidates = range(version + 1, min(version + max_staleness + 1, last_step) + 1)
    return [n for n in candidates if sampling_version(n, max_staleness, is_checkpoint) == version]


def check_staleness(config: Any, p: Problems) -> None:
    """``train.max_staleness >= 1`` needs a run whose sampling can move away from the
    update: a built-in environment with the ``independent`` strategy (a sampler
    process holding a transformers copy, a vLLM engine or a vLLM server's client: any
    ``policy.backend``), or the agent loop at ``K = 1`` (partial rollouts,
    :mod:`turnrl.train.agent.asynchronous`); no Ray workers;
    under torchrun each rank has a sampler process of its own
    (:mod:`turnrl.train.online.async_ranks`), not on one vLLM server (each would push
    its own copy to it); with ``train.sharding = "fsdp2"`` each rank's push is gathered
    from the shards (:mod:`turnrl.train.online.async_ranks`).
    ``config`` is a ``RunConfig``; ``p`` the top level's problems."""
    staleness = config.train.max_staleness
    p.at_least("train.max_staleness", staleness, 0)
    if staleness < 1:
        return
    from turnrl.train.distributed import world_from_env  # torch: only for an async run

    key = "train.max_staleness"
    if config.mode == "agent":
        if staleness > 1:
            p.add(
                key,
                "the agent loop runs at most one step ahead: the next step's agents run "
                "during the update, their calls after it sample with the new weights (use 1)",
            )
    elif config.rollout.strategy in ASYNC_REFUSALS:
        why = ASYNC_REFUSALS[config.rollout.strategy]
        p.add(key, f"needs rollout.strategy = 'independent': {why} (use 0)")
    elif config.rollout.strategy != "independent":
        p.add(key, "needs rollout.strategy = 'independent' (the one strategy built for it)")
    if config.rollout.workers > 0:
        p.add(key, "not with rollout.workers: Ray workers sample in step with the learner (use 0)")
    world = world_from_env()
    if world.split and config.mode == "agent":
        p.add(
            key,
            f"the agent loop runs ahead in one process; torchrun started {world.size} "
            "ranks (use 0)",
        )
    elif world.split and config.policy.backend == "vllm-server":
        p.add(
            key,
            f"each of torchrun's {world.size} ranks has a sampler process, and each would "
            "push its own copy of the weights to the one vLLM server between the others' "
            "requests (use 0, or policy.backend = 'hf')",
        )
