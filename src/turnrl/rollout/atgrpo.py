"""AT-GRPO: agent- and turn-wise candidates ("Stronger MAS", ICLR 2026; PettingLLMs).

Per task one main trajectory. At every turn, ``candidates`` (K) responses are
sampled from the main trajectory's current state (K environments restored from
its snapshot, one shared prefill); each candidate is stepped and scored by its
immediate reward; the main trajectory advances with the best one; all K
candidates are trained. Candidates of one (task, role, turn) share the exact
context, hence one ``node_id``.

Credit: use ``credit.estimator = "node"`` with ``credit.params = { gamma = 0.0,
use_std = true }``: ``gamma = 0`` makes each row's score its immediate reward
and the node group is AT-GRPO's (environment instance, agent, turn) group, so
``A = (r - mean_K) / std_K``. Records (see :mod:`turnrl.rollout.tree`): the
main trajectory ``<task>#<slot>``; each unchosen candidate is a trajectory
``<main>.t<turn>c<j>`` of the main's turns ``0..turn-1`` (copies,
``train = False``, own nodes) and its own turn. Do not use ``role_turn`` or
``grpo`` on these records: copies would enter (task, role, turn) groups, and
one-turn candidate trajectories are no rollouts of the task.

Departures from the paper:

* Roles: turnrl's runner writes role ``"agent"`` (single-agent environments),
  so the groups are (task, turn). Multi-agent environments would need the
  environment to say whose turn it is, which the ``Env`` contract does not.
* Reward: the environment's reward, not ``alpha * team + local``.
* Ties: with sparse rewards most candidates tie at 0. Ties are broken by a
  scorer (``tie_break``, default the environment heuristic of
  :mod:`turnrl.rollout.scorers`), then by sampling order. The paper does not
  say how it breaks ties.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from turnrl.rollout.runner import RolloutBatch, start_episode
from turnrl.rollout.scorers import make_scorer
from turnrl.rollout.strategies import StepExperience, StrategyContext, register_strategy
from turnrl.rollout.tokens import PrefixReuse
from turnrl.rollout.tree import (
    Branch,
    Seeds,
    clone_episode,
    copy_rows,
    exclude,
    learn_on,
    step_branches,
    tree_experience,
)
from turnrl.types import Task, TurnRecord


def choose(rewards: Sequence[float], ties: Sequence[float]) -> int:
    """Index of the best candidate: highest reward, then highest tie score, then first."""
    return max(range(len(rewards)), key=lambda i: (rewards[i], ties[i], -i))


@register_strategy("atgrpo")
def atgrpo(
    ctx: StrategyContext,
    tasks: Sequence[Task],
    group_size: int,
    *,
    candidates: int | None = None,
    tie_break: str | dict[str, float] = "heuristic",
    max_turns: int = 32,
    prefix_cache: bool = True,
) -> StepExperience:
    """Greedy advance with ``candidates`` (default ``group_size``) responses per turn."""
    n = group_size if candidates is None else candidates
    if n < 1:
        raise ValueError(f"atgrpo needs at least 1 candidate per turn; got {n}")
    scorer = make_scorer(tie_break)
    policy = PrefixReuse(ctx.policy, enabled=prefix_cache)
    seeds = Seeds(ctx.seed)
    work = RolloutBatch(records=[], episodes=[])
    mains = [
        Branch(start_episode(policy, ctx.make_env, t, f"{ctx.traj_prefix}{t.task_id}#{i}"))
        for i, t in enumerate(tasks)
    ]
    side: list[TurnRecord] = []
    while True:
        groups = {
            m.traj_id: [
                Branch(
                    clone_episode(m.episode, ctx.make_env, f"{m.traj_id}.t{m.episode.turn}c{j}"),
                    list(m.records),
                )
                for j in range(n)
            ]
            for m in mains
            if m.active
        }
        if not step_branches(
            policy, [c for g in groups.values() for c in g], work, ctx, seeds.next(), max_turns
        ):
            break
        for index, main in enumerate(mains):
            group = groups.get(main.traj_id)
            if group is None:
                continue
            if any(len(c.records) == len(main.records) for c in group):
                main.episode.done, main.episode.end = True, group[0].episode.end  # not sampled
                continue
            best = choose([c.records[-1].reward for c in group], scorer(group, policy))
            chosen = group[best]
            chosen.episode.traj_id = main.traj_id
            chosen.records[-1] = dataclasses.replace(chosen.records[-1], traj_id=main.traj_id)
            for j, candidate in enumerate(group):
                if j != best:
                    prefix = exclude(copy_rows(main.records, candidate.traj_id))
                    side += [*prefix, candidate.records[-1]]
            mains[index] = Branch(chosen.episode, [*main.records, chosen.records[-1]])
    records = [r for m in mains for r in m.records] + side
    stats = learn_on(ctx, records)
    return tree_experience(
        records,
        [m.episode for m in mains],
        work,
        policy.tokens_computed,
        [stats] if stats is not None else [],
        candidates=n,
    )
