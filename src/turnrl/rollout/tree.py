"""Bookkeeping shared by the tree strategies (PATR, RTPO, AT-GRPO).

How a tree becomes turn records. Every root-to-leaf path is one trajectory
(its own ``traj_id``, turns ``0..n-1``), so ``TurnTable`` validation, returns
and trajectory outcomes mean what they always mean. A turn shared by several
paths (the prefix before a branch point) is sampled and stepped once, but
written once per path through it: the first path holds the original row, the
others hold copies marked ``copy_of = <traj_id of the original>``. Copies
have the same context, hence the same default ``node_id``.

Two fields of :class:`~turnrl.types.TurnRecord` carry the rest (left out of
the JSON line in the ordinary case):

* ``copy_of`` (str): this row repeats the row at the same turn of that
  trajectory; it is not a new environment step.
* ``train`` (bool, default true): false marks a row that shapes credit
  (returns, table structure) but is not updated on: RTPO's trunk, its
  sibling's prefixes and continuations, AT-GRPO's prefixes. Such rows also
  get a ``node_id`` of their own (``solo:<traj>:<turn>``) so that they enter
  no node baseline.

Whether copies are trained is the strategy's choice: PATR trains them (GRPO over
leaves: each leaf's whole path is a sample), RTPO and AT-GRPO do not.

Environments branch through ``snapshot()`` (:class:`~turnrl.types.Snapshots`) restored
into a fresh environment; the policy samples through :class:`~turnrl.rollout.tokens.PrefixReuse`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from turnrl.rollout.runner import Episode, RolloutBatch, step_episodes
from turnrl.rollout.strategies import StepExperience, StrategyContext
from turnrl.rollout.tokens import token_metrics
from turnrl.types import Env, Policy, Snapshots, TurnRecord, require


@dataclass
class Branch:
    """One path of a tree in progress: its episode and its records from the root."""

    episode: Episode
    records: list[TurnRecord] = field(default_factory=list)
    pruned: bool = False
    score: float | None = None
    """Last process score (PATR), for inspection."""

    @property
    def traj_id(self) -> str:
        return self.episode.traj_id

    @property
    def active(self) -> bool:
        """Still to be stepped: neither finished nor pruned."""
        return not self.episode.done and not self.pruned


def clone_episode(episode: Episode, make_env: Callable[[], Env], traj_id: str) -> Episode:
    """An independent copy of ``episode`` under ``traj_id``: a fresh environment restored
    from ``episode.env.snapshot()``; the context and counters are copied. The
    environment needs :class:`~turnrl.types.Snapshots` (a clear error says so)."""
    purpose = "a tree rollout (branching from a saved state)"
    env = make_env()
    require(env, Snapshots, purpose).restore(require(episode.env, Snapshots, purpose).snapshot())
    return dataclasses.replace(episode, traj_id=traj_id, env=env, context=list(episode.context))


def copy_rows(records: Iterable[TurnRecord], traj_id: str) -> list[TurnRecord]:
    """Copies of ``records`` under ``traj_id``, each marked ``copy_of`` its original's
    trajectory (a copy of a copy points to the original)."""
    return [
        dataclasses.replace(r, traj_id=traj_id, copy_of=r.copy_of or r.traj_id) for r in records
    ]


def exclude(records: Iterable[TurnRecord]) -> list[TurnRecord]:
    """The rows marked not trained, each with a node of its own (in no baseline).

    A row that is never learned on has no advantage; the rollout log writes 0."""
    return [
        dataclasses.replace(r, train=False, node_id=f"solo:{r.traj_id}:{r.turn}") for r in records
    ]


def branch(parent: Branch, make_env: Callable[[], Env], traj_id: str) -> Branch:
    """A child of ``parent`` at its current state: cloned episode, copied path."""
    return Branch(
        clone_episode(parent.episode, make_env, traj_id), copy_rows(parent.records, traj_id)
    )


def step_branches(
    policy: Policy,
    branches: Sequence[Branch],
    batch: RolloutBatch,
    ctx: StrategyContext,
    seed: int,
    max_turns: int,
) -> list[Branch]:
    """One batched turn for every active branch; each new record joins its branch's
    path. Returns the branches that were stepped."""
    by_traj = {b.traj_id: b for b in branches if b.active}
    records = step_episodes(
        policy,
        [b.episode for b in by_traj.values()],
        batch,
        max_new_tokens=ctx.max_new_tokens,
        temperature=ctx.temperature,
        seed=seed,
        max_turns=max_turns,
    )
    stepped = []
    for record in records:
        owner = by_traj[record.traj_id]
        owner.records.append(record)
        stepped.append(owner)
    return stepped


class Seeds:
    """Distinct sampling seeds for the successive batched calls of one strategy step."""

    def __init__(self, base: int) -> None:
        self.base = base * 1009
        self.calls = 0

    def next(self) -> int:
        self.calls += 1
        return self.base + self.calls


def trainable(records: Iterable[TurnRecord]) -> int:
    """Number of rows that will be updated on (``train`` not false, with response tokens)."""
    return sum(1 for r in records if r.train and r.response_ids)


def learn_on(ctx: StrategyContext, records: list[TurnRecord]) -> dict[str, float] | None:
    """Credit on all ``records``, update only on rows whose ``train`` is not false.

    Rows with ``train = False`` still count in the credit table (returns,
    trajectory structure); the trainer's update batch leaves them out
    (:func:`turnrl.train.update.ppo.build_update_batch`). Returns None (and learns
    nothing) when no row is trainable.
    """
    if not trainable(records):
        return None
    return ctx.learn(records)


def physical_env_steps(records: Iterable[TurnRecord]) -> int:
    """Environment steps actually taken: rows that are not copies."""
    return sum(1 for r in records if not r.copy_of)


def tree_experience(
    records: list[TurnRecord],
    episodes: list[Episode],
    work: RolloutBatch,
    tokens_computed: int | None,
    stats: list[dict[str, float]],
    **extra: float,
) -> StepExperience:
    """A tree strategy's step result: its records and leaf episodes with the costs
    gathered in ``work``, token accounting, physical env steps, and ``extra``."""
    batch = RolloutBatch(records=records, episodes=episodes)
    merge_costs(batch, work)
    metrics = {
        **token_metrics(records, tokens_computed),
        "rollout_env_steps": float(physical_env_steps(records)),
        **{key: float(value) for key, value in extra.items()},
    }
    return StepExperience(batch, stats, metrics)


def merge_costs(into: RolloutBatch, other: RolloutBatch) -> None:
    """Add ``other``'s sampling costs and timings to ``into``."""
    into.sampled_tokens += other.sampled_tokens
    into.context_tokens += other.context_tokens
    into.seconds_sampling += other.seconds_sampling
    into.seconds_env += other.seconds_env
