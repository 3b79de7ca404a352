"""Rollout strategies, registered by name (``rollout.strategy`` in the config).

A strategy collects one step's experience and decides when the policy learns
from it: most strategies collect a batch and call ``ctx.learn`` once; RTPO
learns once per turn position, from the last turn back to the first. The
trainer supplies ``learn`` (credit assignment + PPO update), so this layer never
imports the trainer.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from turnrl.rollout.runner import RolloutBatch, run_episodes
from turnrl.rollout.tokens import PrefixReuse, token_metrics
from turnrl.types import Env, Policy, Task, TurnRecord


@dataclass
class StrategyContext:
    """What a strategy may use during one training step."""

    policy: Policy
    make_env: Callable[[], Env]
    max_new_tokens: int
    temperature: float
    learn: Callable[[list[TurnRecord]], dict[str, float]]
    """Compute credit on these turn records and update the policy; returns statistics."""
    seed: int
    traj_prefix: str
    runner: Callable[..., RolloutBatch] = run_episodes
    """Runs independent episodes, with ``run_episodes``'s signature: in this process by
    default, or elsewhere (``RayRolloutPool.run_episodes``: Ray workers holding their own
    policy copies, which ignore ``policy`` and ``make_env``)."""


class RolloutPool(Protocol):
    """Runs independent episodes outside this process (e.g. Ray rollout workers).

    ``run_episodes`` has the in-process runner's signature (it may ignore ``policy``
    and ``make_env``); ``push_weights`` hands it the learner's weights as ``version``
    (the trainer pushes before its first rollout and after every update).
    """

    def run_episodes(
        self, policy: Policy, make_env: Callable[[], Env], tasks: Sequence[Task], **kwargs: Any
    ) -> RolloutBatch: ...

    def push_weights(self, state_dict: Mapping[str, Any], version: int) -> None: ...


POOL_METRICS = ("workers", "worker_restarts", "policy_version")
"""What a rollout pool reports in ``RolloutBatch.extra`` and a step's metrics carry:
worker count, workers replaced during the batch, the weights' version it sampled with."""


@dataclass
class StepExperience:
    """What a strategy hands back: the records learned from and their statistics."""

    batch: RolloutBatch
    learn_stats: list[dict[str, float]] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)
    """Strategy-specific metrics (e.g. tokens computed vs unique tokens)."""


class Strategy(Protocol):
    def __call__(
        self, ctx: StrategyContext, tasks: Sequence[Task], group_size: int, **params: Any
    ) -> StepExperience: ...


_STRATEGIES: dict[str, Strategy] = {}


def register_strategy(name: str) -> Callable[[Strategy], Strategy]:
    """Decorator: make a strategy selectable as ``rollout.strategy = name``."""

    def decorate(fn: Strategy) -> Strategy:
        if name in _STRATEGIES:
            raise ValueError(f"rollout strategy {name!r} is already registered")
        _STRATEGIES[name] = fn
        return fn

    return decorate


def get_strategy(name: str) -> Strategy:
    if name not in _STRATEGIES:
        raise ValueError(
            f"unknown rollout strategy {name!r}; known: {', '.join(sorted(_STRATEGIES))}"
        )
    return _STRATEGIES[name]


def list_strategies() -> list[str]:
    """Names of the registered strategies (import ``turnrl.rollout`` to register all)."""
    return sorted(_STRATEGIES)


def strategy_params(name: str) -> dict[str, Any]:
    """Keyword options of a strategy and their defaults."""
    signature = inspect.signature(get_strategy(name))
    return {
        k: p.default
        for k, p in signature.parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


@register_strategy("independent")
def independent(
    ctx: StrategyContext, tasks: Sequence[Task], group_size: int, *, prefix_cache: bool = True
) -> StepExperience:
    """``group_size`` independent episodes per task (standard GRPO sampling), one update.

    ``prefix_cache`` (on by default) samples through a shared KV cache: the
    group's common prompt and each trajectory's earlier turns are not
    re-encoded, and identical samples decode once; the samples are the same as
    without it up to float rounding. ``prefix_cache = false`` re-encodes every
    context at every turn, as independent sampling is usually run. ``extra``
    reports the token counts of :mod:`turnrl.rollout.tokens`, and a rollout
    pool's ``POOL_METRICS`` when the batch ran on one.
    """
    policy = PrefixReuse(ctx.policy, enabled=prefix_cache)
    batch = ctx.runner(
        policy,
        ctx.make_env,
        tasks,
        group_size=group_size,
        max_new_tokens=ctx.max_new_tokens,
        temperature=ctx.temperature,
        seed=ctx.seed,
        traj_prefix=ctx.traj_prefix,
    )
    extra = {
        **token_metrics(batch.records, batch.extra.get("tokens_computed", policy.tokens_computed)),
        "rollout_env_steps": float(len(batch.records)),
        **{key: batch.extra[key] for key in POOL_METRICS if batch.extra.get(key) is not None},
    }
    return StepExperience(batch, [ctx.learn(batch.records)], extra)
