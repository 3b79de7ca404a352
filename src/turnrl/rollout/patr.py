"""PATR: process-scorer guided adaptive tree rollout (arXiv 2607.15610).

Per task: start ``branches`` (B0) episodes; every ``interval`` (K) turns,
score the active ones with a process scorer (:mod:`turnrl.rollout.scorers`);
a branch scoring below ``median - alpha`` is pruned; of the others, the
``top_k`` best each get ``children`` (M) children sampled from their current
state (the parent is replaced by its children; the first child keeps the
parent's ``traj_id``); middling branches just continue. A branch whose last
``repeats`` (Theta) responses are identical is pruned at once. Pruned branches
stay in the group as leaves, labelled with the outcome they reached (no success
reward): negatives. Children branch from the environment's ``snapshot()`` and share the KV
cache of their common prefix (``prefix_cache``).

Records: every root-to-leaf path is a trajectory (shared turns are copies, see
:mod:`turnrl.rollout.tree`), all rows are trained, one update per step.
``credit.estimator = "grpo"`` is PATR's GRPO over the leaves;
``credit.estimator = "node"`` gives node advantages at every branch point.

Departures from the paper:

* Budget: the tree stops growing once it has ``group_size`` leaves (each
  expansion adds ``children - 1``), so PATR and ``independent`` can be compared
  at the same number of leaves. The paper gives no cap.
* Scores are compared within one task's tree, among its active branches.
* ``repeats``: "the same action Theta times" is read as Theta identical
  consecutive responses (after stripping whitespace, case-folded).
* Node advantages are weighted by leaves: a turn with several leaves below it
  appears once per leaf, in its node's mean and in the loss (as GRPO over
  leaves weights it). A turn with a single child path gets advantages that sum
  to zero over its copies. This option is turnrl's, not the paper's.
* Default ``interval`` per environment: FrozenLake 5 (the paper's K), the
  calculator 1 (episodes of at most 4 turns), anything else 2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from turnrl.envs import CalculatorEnv, FrozenLakeEnv
from turnrl.rollout.runner import RolloutBatch, start_episode
from turnrl.rollout.scorers import Scorer, make_scorer
from turnrl.rollout.strategies import StepExperience, StrategyContext, register_strategy
from turnrl.rollout.tokens import PrefixReuse
from turnrl.rollout.tree import Branch, Seeds, branch, learn_on, step_branches, tree_experience
from turnrl.types import Env, Task

DEFAULT_INTERVAL: dict[type, int] = {FrozenLakeEnv: 5, CalculatorEnv: 1}
"""Turns between scoring rounds, by environment type (PATR's K per environment)."""


def default_interval(env: Env) -> int:
    return next((k for t, k in DEFAULT_INTERVAL.items() if isinstance(env, t)), 2)


@dataclass
class Tree:
    """One task's branches (leaves so far) and the counter of its branch ids."""

    prefix: str
    budget: int
    branches: list[Branch] = field(default_factory=list)
    made: int = 0
    expansions: int = 0

    def next_id(self) -> str:
        self.made += 1
        return f"{self.prefix}.{self.made - 1}"


def _action(text: str) -> str:
    return " ".join(text.split()).casefold()


def repeated(b: Branch, repeats: int) -> bool:
    """Whether the branch's last ``repeats`` responses are the same action."""
    if repeats <= 0 or len(b.records) < repeats:
        return False
    last = {_action(r.response or "") for r in b.records[-repeats:]}
    return len(last) == 1


def prune(b: Branch) -> None:
    """End a branch as a negative leaf: it keeps the outcome it reached, no more turns."""
    b.pruned = True
    b.episode.done, b.episode.end, b.episode.correct = True, "pruned", False
    if b.records:
        b.records[-1] = dataclasses.replace(b.records[-1], pruned=True)


def score_round(
    tree: Tree,
    scorer: Scorer,
    policy: PrefixReuse,
    make_env,
    *,
    top_k: int,
    children: int,
    alpha: float,
) -> None:
    """Score the tree's active branches; prune the weak, expand the best within budget."""
    active = [b for b in tree.branches if b.active]
    if not active:
        return
    scores = scorer(active, policy)
    median = float(np.median(scores))
    survivors = []
    for b, s in zip(active, scores, strict=True):
        b.score = float(s)
        if s < median - alpha:
            prune(b)
        else:
            survivors.append(b)
    # Best first; ties keep creation order (stable sort).
    survivors.sort(key=lambda b: -(b.score or 0.0))
    for parent in survivors[:top_k]:
        if len(tree.branches) + children - 1 > tree.budget:
            break
        tree.branches.extend(branch(parent, make_env, tree.next_id()) for _ in range(children - 1))
        tree.expansions += 1


@register_strategy("patr")
def patr(
    ctx: StrategyContext,
    tasks: Sequence[Task],
    group_size: int,
    *,
    branches: int = 4,
    interval: int | None = None,
    top_k: int = 2,
    children: int = 2,
    alpha: float = 0.5,
    repeats: int = 6,
    scorer: str | dict[str, float] = "heuristic",
    max_turns: int = 32,
    prefix_cache: bool = True,
) -> StepExperience:
    """PATR trees of at most ``group_size`` leaves per task, one update on all leaves.

    ``branches`` B0, ``interval`` K (None: per environment), ``top_k``,
    ``children`` M, ``alpha``, ``repeats`` Theta (0 disables), ``scorer`` (see
    :func:`turnrl.rollout.scorers.make_scorer`), ``max_turns`` safety cap,
    ``prefix_cache`` (share the KV cache of common prefixes).
    """
    if branches < 1 or children < 1 or top_k < 0 or group_size < 1:
        raise ValueError(
            f"patr needs branches >= 1, children >= 1, top_k >= 0 and group_size >= 1; got "
            f"branches={branches}, children={children}, top_k={top_k}, group_size={group_size}"
        )
    score = make_scorer(scorer)
    policy = PrefixReuse(ctx.policy, enabled=prefix_cache)
    seeds = Seeds(ctx.seed)
    trees = []
    for slot, task in enumerate(tasks):
        tree = Tree(f"{ctx.traj_prefix}{task.task_id}#{slot}", budget=max(group_size, 1))
        for _ in range(min(branches, group_size)):
            episode = start_episode(policy, ctx.make_env, task, tree.next_id())
            tree.branches.append(Branch(episode))
        trees.append(tree)
    if interval is None:
        interval = default_interval(trees[0].branches[0].episode.env) if trees else 1
    if interval < 1:
        raise ValueError(f"patr interval must be >= 1, got {interval}")
    work = RolloutBatch(records=[], episodes=[])
    turn = 0
    while any(b.active for t in trees for b in t.branches):
        all_branches = [b for t in trees for b in t.branches]
        stepped = step_branches(policy, all_branches, work, ctx, seeds.next(), max_turns)
        if not stepped:
            break
        turn += 1
        for b in stepped:
            if b.active and repeated(b, repeats):
                prune(b)
        if turn % interval == 0:
            for tree in trees:
                score_round(
                    tree, score, policy, ctx.make_env, top_k=top_k, children=children, alpha=alpha
                )
    leaves = [b for t in trees for b in t.branches]
    records = [r for b in leaves for r in b.records]
    stats = learn_on(ctx, records)
    return tree_experience(
        records,
        [b.episode for b in leaves],
        work,
        policy.tokens_computed,
        [stats] if stats is not None else [],
        leaves=len(leaves),
        pruned_leaves=sum(b.pruned for b in leaves),
        expansions=sum(t.expansions for t in trees),
    )
