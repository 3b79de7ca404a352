"""Which rows share an optimiser step: mini-batches of rows, or of whole task trees.

``PPOConfig.minibatch_size`` counts rows (turns). With ``update = "rows"`` an epoch
shuffles the rows and cuts them into ``ceil(rows / minibatch_size)`` chunks
(today's behaviour, unchanged).

With ``update = "tree"`` a mini-batch holds whole trees (a tree is every row of
one task: its group's trajectories, their turns, a tree rollout's branches and
copies), because the tree layout computes a prefix once only for the rows of
one forward. The choice made here, and why:

* **as many optimiser steps as rows would give**: ``ceil(rows /
  minibatch_size)`` mini-batches per epoch, so a recipe's number of steps and
  its ``minibatch_size`` mean what they meant; but at most one per tree (a tree
  is never split across optimiser steps), so when trees hold more rows than
  ``minibatch_size`` there are fewer, larger steps (e.g. the SmolLM2 recipe:
  4 trees of about 5 rows with ``minibatch_size = 4`` make 4 steps, not 6);
* **about equal rows per step**: each epoch shuffles the trees and cuts the
  shuffled list into that many contiguous groups where the running row count
  passes each multiple of ``rows / n_minibatches`` (never leaving a group
  empty), so which trees share a step changes from epoch to epoch, as rows do;
* the loss scale is unchanged: aggregation weights are computed once for the
  whole batch and multiplied by the number of mini-batches actually made, so the
  mean of the steps' gradients is the full-batch gradient, whatever the split.

Inside a mini-batch, :func:`turnrl.policy.tree_layout.split_rows` cuts forwards
at ``max_tokens_per_batch`` (gradient accumulation: the same step).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def minibatch_count(rows: int, minibatch_size: int) -> int:
    """``ceil(rows / minibatch_size)``, at least 1."""
    size = max(1, min(minibatch_size, rows))
    return max(1, -(-rows // size))


def row_minibatches(rows: int, minibatch_size: int, generator: torch.Generator) -> list[list[int]]:
    """Shuffled rows cut into chunks of ``minibatch_size`` (the last may be smaller)."""
    size = max(1, min(minibatch_size, rows))
    order = torch.randperm(rows, generator=generator).tolist()
    return [order[start : start + size] for start in range(0, rows, size)]


def tree_minibatches(
    tree_B: Sequence[int], minibatch_size: int, generator: torch.Generator
) -> list[list[int]]:
    """Rows grouped by tree (``tree_B``: one tree id per row), trees shuffled and cut into
    ``min(ceil(rows / minibatch_size), trees)`` non-empty mini-batches of about equal
    rows (see the module docstring). Rows keep their batch order within a tree."""
    members: dict[int, list[int]] = {}
    for b, tree in enumerate(tree_B):
        members.setdefault(int(tree), []).append(b)
    trees = list(members.values())
    rows = len(tree_B)
    count = min(minibatch_count(rows, minibatch_size), len(trees))
    order = torch.randperm(len(trees), generator=generator).tolist()
    groups: list[list[int]] = [[]]
    seen = 0
    for position, t in enumerate(order):
        groups[-1].extend(trees[t])
        seen += len(trees[t])
        trees_left = len(order) - position - 1
        groups_left = count - len(groups)
        if groups_left > 0 and (seen >= len(groups) * rows / count or trees_left == groups_left):
            groups.append([])
    return groups
