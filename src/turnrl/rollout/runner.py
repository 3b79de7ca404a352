"""Batched multi-turn rollouts that write exact turn records.

All live episodes are stepped together: at each turn the runner collects every
unfinished episode's context, samples all responses in ONE batched call, steps
each environment, and appends ``response ids + observation ids`` to each
context. Contexts are never re-rendered from text, so a record's
``prompt_ids``/``response_ids`` are exactly the tokens sampled, and the trainer
scores exactly those tokens.

A response cut at ``max_new_tokens`` (``stop_reason == "length"``) is passed to
the environment's ``step_truncated`` when it has one (:class:`~turnrl.types.Truncation`;
otherwise to ``step``: usually a malformed action; an environment may end the episode
instead); if the episode
goes on, the end-of-turn token is appended to the context as part of the next
observation (it was not sampled, so it is not trained on).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnrl.rollout.success import success_flag
from turnrl.types import Env, Policy, Task, Truncation, TurnRecord, state_key_of


@dataclass
class Episode:
    """One trajectory in progress."""

    task: Task
    traj_id: str
    env: Env
    context: list[int]
    turn: int = 0
    done: bool = False
    outcome: float = 0.0
    tool_calls: int = 0
    malformed: int = 0
    truncated_responses: int = 0
    opened_with_tool: bool | None = None
    """Whether the first response (turn 0) was a tool call; None before it."""
    correct: bool | None = None
    end: str = ""
    """Why the episode ended: "env" (the environment said done), "context" (no room left
    for the next turn in the policy's ``max_context``: the model's, or the smaller
    per-turn cap ``rollout.max_context_tokens``, :mod:`turnrl.rollout.context_cap`),
    "max_turns"."""
    seed: int | None = None
    """Per-episode sampling seed, or ``None`` (the batch's seed). With it, turn ``t`` of this
    episode samples from its own generator seeded ``turn_seed(seed, t)``, whatever other
    episodes share the batch, so a batch can be split (e.g. across Ray workers) without
    changing any episode's tokens."""


@dataclass
class RolloutBatch:
    """Turn records of a batch of episodes, plus per-episode summaries and costs."""

    records: list[TurnRecord]
    episodes: list[Episode]
    sampled_tokens: int = 0
    context_tokens: int = 0
    """Sum over sampling calls of context lengths (tokens the model had to attend over)."""
    seconds_sampling: float = 0.0
    seconds_env: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def episode_seed(seed: int, index: int) -> int:
    """Sampling seed of episode ``index`` of a batch run with ``seed``."""
    return (seed * 1_000_003 + index) % 2**63


def turn_seed(seed: int, turn: int) -> int:
    """Sampling seed of turn ``turn`` of an episode with seed ``seed``."""
    return (seed * 1009 + turn) % 2**63


def plan_episodes(
    tasks: Sequence[Task], group_size: int, traj_prefix: str
) -> list[tuple[Task, str]]:
    """``(task, traj_id)`` of each episode of a batch, in batch order (the episode index).

    The slot index keeps ids unique when a task is drawn twice in one batch.
    """
    return [
        (task, f"{traj_prefix}{task.task_id}#{slot * group_size + g}")
        for slot, task in enumerate(tasks)
        for g in range(group_size)
    ]


def start_episode(
    policy: Policy,
    make_env: Callable[[], Env],
    task: Task,
    traj_id: str,
    seed: int | None = None,
) -> Episode:
    """A fresh episode of ``task``: a new environment, reset, and its initial context."""
    env = make_env()
    messages = env.reset(task)
    return Episode(task, traj_id, env, policy.encode_initial(messages), seed=seed)


def run_episodes(
    policy: Policy,
    make_env: Callable[[], Env],
    tasks: Sequence[Task],
    *,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    traj_prefix: str = "",
    max_turns: int = 32,
    per_episode_seeds: bool = False,
) -> RolloutBatch:
    """Run ``group_size`` independent episodes per task, all in one batch.

    ``seed`` makes the whole batch reproducible (turn ``t`` samples with seed
    ``seed * 1009 + t``). ``max_turns`` is a safety cap on top of the
    environment's own limit. ``per_episode_seeds`` gives episode ``k`` its own
    seed ``episode_seed(seed, k)`` instead (see ``Episode.seed``): the same
    episodes then come out however the batch is split, which is what the Ray
    rollout workers do.
    """
    episodes = [
        start_episode(
            policy, make_env, task, traj_id, episode_seed(seed, k) if per_episode_seeds else None
        )
        for k, (task, traj_id) in enumerate(plan_episodes(tasks, group_size, traj_prefix))
    ]
    return continue_episodes(
        policy,
        episodes,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        max_turns=max_turns,
    )


def run_planned_episodes(
    policy: Policy,
    make_env: Callable[[], Env],
    planned: Sequence[tuple[int, Task, str]],
    *,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    max_turns: int = 32,
) -> RolloutBatch:
    """Run some episodes of a batch planned with :func:`plan_episodes`: ``planned`` holds
    ``(episode index, task, traj_id)``, and episode ``k`` samples with its own seed
    ``episode_seed(seed, k)``. Any split of a batch's plan gives each episode the tokens
    ``run_episodes(..., per_episode_seeds=True)`` gives it (Ray workers and torchrun
    ranks each run their share this way)."""
    episodes = [
        start_episode(policy, make_env, task, traj_id, episode_seed(seed, k))
        for k, task, traj_id in planned
    ]
    return continue_episodes(
        policy,
        episodes,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        max_turns=max_turns,
    )


def continue_episodes(
    policy: Policy,
    episodes: list[Episode],
    *,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    max_turns: int = 32,
) -> RolloutBatch:
    """Step the given episodes (fresh or restored mid-way) until all are done."""
    batch = RolloutBatch(records=[], episodes=episodes)
    step = 0
    while step_episodes(
        policy,
        episodes,
        batch,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed * 1009 + step,
        max_turns=max_turns,
    ):
        step += 1
    return batch


def step_episodes(
    policy: Policy,
    episodes: Sequence[Episode],
    batch: RolloutBatch,
    *,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    max_turns: int = 32,
) -> list[TurnRecord]:
    """Advance every live episode by ONE turn, in one batched ``policy.sample`` call.

    Episodes at ``max_turns`` or without room for a response are marked done
    first. The new turn records are appended to ``batch.records`` (and its costs
    to ``batch``) and returned; an empty list means no episode was live. Tree
    rollouts call this directly to act between turns (score, branch, prune).
    Episodes with their own ``seed`` sample with per-row seeds (``seed`` is then
    unused); a batch must not mix episodes with and without one.
    """
    live = [e for e in episodes if not e.done]
    for e in live:
        room = policy.max_context is None or len(e.context) + max_new_tokens <= policy.max_context
        if e.turn >= max_turns or not room:
            e.done, e.end = True, "context" if not room else "max_turns"
    live = [e for e in live if not e.done]
    if not live:
        return []
    own = [e.seed is not None for e in live]
    if any(own) and not all(own):
        raise ValueError("step_episodes: some live episodes have their own seed and some do not")
    started = time.perf_counter()
    samples = policy.sample(
        [e.context for e in live],
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=[turn_seed(e.seed, e.turn) for e in live if e.seed is not None] if all(own) else seed,
    )
    batch.seconds_sampling += time.perf_counter() - started
    batch.sampled_tokens += sum(len(s.response_ids) for s in samples)
    batch.context_tokens += sum(len(e.context) for e in live)
    started = time.perf_counter()
    records = []
    for episode, sample in zip(live, samples, strict=True):
        state_key = state_key_of(episode.env)
        truncated = sample.stop_reason == "length"
        env = episode.env
        cut = truncated and isinstance(env, Truncation)
        result = env.step_truncated(sample.text) if cut else env.step(sample.text)
        info = result.info
        record = TurnRecord(
            task_id=episode.task.task_id,
            traj_id=episode.traj_id,
            turn=episode.turn,
            prompt_ids=tuple(episode.context),
            response_ids=tuple(sample.response_ids),
            logprobs=tuple(float(x) for x in sample.logprobs),
            response=sample.text,
            reward=float(result.reward),
            done=bool(result.done),
            state_key=state_key,
            tags=tuple(episode.task.tags),
            tool_call=bool(info.get("tool_call", False)),
            malformed=bool(info.get("malformed", False)),
            stop_reason=sample.stop_reason,
        )
        records.append(record)
        episode.outcome += float(result.reward)
        episode.tool_calls += int(bool(record.tool_call))
        if episode.turn == 0:
            episode.opened_with_tool = bool(record.tool_call)
        episode.malformed += int(record.malformed)
        episode.truncated_responses += int(truncated)
        episode.turn += 1
        if result.done:
            episode.done, episode.end = True, "env"
            episode.correct = success_flag(
                info.get("correct"),
                f"environment {type(env).__name__} (task {episode.task.task_id}): info['correct']",
            )
            continue
        assert result.observation is not None
        episode.context = episode.context + list(sample.response_ids)
        if sample.stop_reason != "stop":
            episode.context.append(policy.eos_token_id)
        episode.context += policy.encode_observation(result.observation)
    batch.records.extend(records)
    batch.seconds_env += time.perf_counter() - started
    return records
