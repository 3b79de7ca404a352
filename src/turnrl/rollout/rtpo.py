"""RTPO: reverse-turn policy optimisation (arXiv 2608.18682).

Per task, one trunk trajectory is sampled with the current policy; before each
of its turns the environment is snapshotted. Then for ``k = K-1`` down to 0
(``K`` = the longest trunk of the batch): every trunk that reached turn ``k``
is restored from its turn-``k`` snapshot into fresh environments, ``siblings``
responses are sampled from the trunk's exact turn-``k`` context with the
CURRENT parameters, each sibling is continued to the end on-policy, and the
policy is updated on the siblings' turn-``k`` rows only. Then ``k - 1``.

Credit: use ``credit.estimator = "node"`` (alias ``rtpo``; ``gamma = 1``, no
std). The siblings at ``k`` share one context, hence one node; their score is
the return from turn ``k``, which differs from the full return ``R_j`` only by
the trunk's rewards before ``k``, the same for all siblings, so the advantage
is ``R_j`` minus the siblings' mean.

Records of one ``k`` (see :mod:`turnrl.rollout.tree`): each sibling is a full
trajectory ``<trunk>.k<k>.<j>``: copies of the trunk's turns ``0..k-1``, its
own turn ``k``, its continuation. Only turn ``k`` is trained; the copies and the
continuation have ``train = False`` and nodes of their own. The trunk is
logged with ``train = False`` and nodes of its own: no gradient, in no
baseline. The trained row's ``prompt_ids`` is the context it was sampled
from, and the trainer recomputes log-probs on exactly those ids.

Departures from the paper:

* "Freeze" is read as: once turn ``k`` has been updated it is never trained
  again in this step; the shared parameters keep changing for earlier turns
  (a single LLM cannot freeze one turn position).
* Tasks whose trunk is shorter than ``k + 1`` turns sit out that ``k``.
* A turn position where every sibling group tied (all advantages zero) is
  not updated on (``updates_skipped``): with Adam, a zero-gradient step still
  moves the parameters, and RTPO makes many small updates.
* The advantage includes each sibling in its own mean (the ``node``
  estimator's convention); the paper's "mean of the siblings' R" may exclude
  it, which would scale the advantage by ``n/(n-1)``.
* Prefix reuse: the siblings at ``k`` share the prefill of their common
  context, but after each update the cache is cleared (states computed with
  older parameters are invalid), so each ``k`` re-encodes the trunk prefix
  once. This is the method's real cost, reported in ``tokens_computed``;
  ``tokens_refresh`` counts those re-encoded trunk contexts (only after a
  position that was updated on: a skipped, tied position leaves the cache valid,
  and re-encoding the turn-k context restores its shorter prefixes too), so
  ``tokens_unique + tokens_refresh`` is the least any implementation could compute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from turnrl.rollout.runner import Episode, RolloutBatch, continue_episodes, start_episode
from turnrl.rollout.strategies import StepExperience, StrategyContext, register_strategy
from turnrl.rollout.tokens import PrefixReuse
from turnrl.rollout.tree import (
    Branch,
    Seeds,
    clone_episode,
    copy_rows,
    exclude,
    learn_on,
    merge_costs,
    step_branches,
    tree_experience,
)
from turnrl.types import Task, TurnRecord


@dataclasses.dataclass
class Trunk:
    """A trunk trajectory and the state before each of its turns."""

    branch: Branch
    before: list[Episode] = dataclasses.field(default_factory=list)
    """``before[k]``: the episode as it was before turn ``k`` (its own restored env)."""


def run_trunks(
    ctx: StrategyContext,
    policy: PrefixReuse,
    tasks: Sequence[Task],
    seeds: Seeds,
    work: RolloutBatch,
    max_turns: int,
) -> list[Trunk]:
    """Sample one trunk per task, snapshotting every state before a turn."""
    trunks = [
        Trunk(Branch(start_episode(policy, ctx.make_env, t, f"{ctx.traj_prefix}{t.task_id}#{i}")))
        for i, t in enumerate(tasks)
    ]
    while True:
        live = [t for t in trunks if t.branch.active]
        for t in live:
            episode = t.branch.episode
            t.before.append(clone_episode(episode, ctx.make_env, episode.traj_id))
        if not step_branches(policy, [t.branch for t in live], work, ctx, seeds.next(), max_turns):
            break
    for t in trunks:
        del t.before[len(t.branch.records) :]  # states that were not followed by a turn
        t.branch.records = exclude(t.branch.records)
    return trunks


def siblings_at(
    ctx: StrategyContext,
    trunks: Sequence[Trunk],
    k: int,
    siblings: int,
    policy: PrefixReuse,
    seed: int,
    max_turns: int,
) -> tuple[list[TurnRecord], list[Episode], RolloutBatch]:
    """Sample ``siblings`` responses at turn ``k`` of every trunk that has one, continue
    each to the end; return their records (trunk prefix copied in), episodes, costs."""
    episodes: list[Episode] = []
    prefixes: dict[str, list[TurnRecord]] = {}
    for trunk in trunks:
        if len(trunk.before) <= k:
            continue
        for j in range(siblings):
            traj_id = f"{trunk.branch.traj_id}.k{k}.{j}"
            episodes.append(clone_episode(trunk.before[k], ctx.make_env, traj_id))
            prefixes[traj_id] = exclude(copy_rows(trunk.branch.records[:k], traj_id))
    batch = continue_episodes(
        policy,
        episodes,
        max_new_tokens=ctx.max_new_tokens,
        temperature=ctx.temperature,
        seed=seed,
        max_turns=max_turns,
    )
    batch.records = [exclude([r])[0] if r.turn > k else r for r in batch.records]
    records = [r for traj in prefixes.values() for r in traj] + batch.records
    return records, episodes, batch


def has_signal(records: Sequence[TurnRecord]) -> bool:
    """Whether some sibling group (trained rows of one task sharing one context) has
    returns that differ. When none does, every RTPO advantage is zero and the update is
    skipped: an optimiser step on a zero gradient still moves Adam's parameters (its
    momentum), and many such steps degrade the policy."""
    trained = {r.traj_id: r for r in records if r.train}
    returns = dict.fromkeys(trained, 0.0)
    for r in records:
        own = trained.get(r.traj_id)
        if own is not None and r.turn >= own.turn:
            returns[r.traj_id] += r.reward
    groups: dict[tuple, set[float]] = {}
    for traj_id, r in trained.items():
        key = (r.task_id, r.prompt_ids)
        groups.setdefault(key, set()).add(round(returns[traj_id], 9))
    return any(len(values) > 1 for values in groups.values())


@register_strategy("rtpo")
def rtpo(
    ctx: StrategyContext,
    tasks: Sequence[Task],
    group_size: int,
    *,
    siblings: int | None = None,
    max_turns: int = 32,
    prefix_cache: bool = True,
    skip_ties: bool = True,
) -> StepExperience:
    """One trunk per task, then ``siblings`` (default ``group_size - 1``) responses per
    turn boundary from the last turn back to the first, one update per turn position
    (``skip_ties``: none where every sibling group tied, see :func:`has_signal`)."""
    n_siblings = group_size - 1 if siblings is None else siblings
    if n_siblings < 1:
        raise ValueError(f"rtpo needs at least 1 sibling per turn; got {n_siblings}")
    policy = PrefixReuse(ctx.policy, enabled=prefix_cache)
    seeds = Seeds(ctx.seed)
    work = RolloutBatch(records=[], episodes=[])
    trunks = run_trunks(ctx, policy, tasks, seeds, work, max_turns)
    records = [r for t in trunks for r in t.branch.records]
    episodes = [t.branch.episode for t in trunks]
    stats = []
    refresh = 0  # trunk contexts re-encoded because an update made cached states stale
    skipped = 0
    stale = False  # the cache was cleared since the trunk contexts were last encoded
    for k in reversed(range(max((len(t.before) for t in trunks), default=0))):
        if stale:
            # Encoding the turn-k contexts again also restores every shorter prefix, so
            # after a skipped (tied) position the next one finds its trunk context cached.
            refresh += sum(len(t.before[k].context) for t in trunks if len(t.before) > k)
            stale = False
        rows, sibling_episodes, batch = siblings_at(
            ctx, trunks, k, n_siblings, policy, seeds.next(), max_turns
        )
        merge_costs(work, batch)
        records += rows
        episodes += sibling_episodes
        if skip_ties and not has_signal(rows):
            skipped += 1  # not learned on: the log writes advantage 0 for these rows
            continue
        learned = learn_on(ctx, rows)
        if learned is not None:
            policy.clear()  # the parameters changed: cached states are stale
            stale = True
            stats.append(learned)
    return tree_experience(
        records,
        episodes,
        work,
        policy.tokens_computed,
        stats,
        leaves=len(episodes),
        updates=len(stats),
        updates_skipped=skipped,
        tokens_refresh=refresh,
    )
