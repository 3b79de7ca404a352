"""Ray rollout workers under torchrun ranks: 2 ranks + 1 local Ray worker equal 2 ranks.

Rank 0 drives the pool (``rollout.workers``): it runs the step's whole plan on the
workers (each episode with its own seed, as the ranks would sample it) and hands every
rank the episodes of its tasks by scatter; after each update rank 0 pushes the weights
to the workers. So the run equals 2 ranks sampling themselves: the same episodes (the
same tokens; log-probs up to float rounding, a worker's batch is another size) and
weights within ``WEIGHT_ATOL`` after each of 3 steps. Skipped only where Ray (the
``ray`` extra) is not installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_distributed import (
    WEIGHT_ATOL,
    assert_metrics_close,
    max_difference,
    metrics,
    train,
    weights,
)

pytest.importorskip("ray", reason="the ray extra is not installed")

TREE = ("train.update=tree",)
POOL_ONLY = ("workers", "worker_restarts", "policy_version")
"""Metrics only a step sampled on a pool reports."""


def test_two_ranks_with_a_ray_worker_equal_two_ranks(tmp_path: Path) -> None:
    alone, pooled = tmp_path / "alone", tmp_path / "pooled"
    train(alone, 2, *TREE)
    train(pooled, 2, *TREE, "rollout.workers=1")
    for step in (1, 2, 3):
        assert max_difference(weights(alone, step), weights(pooled, step)) <= WEIGHT_ATOL, step
    assert max_difference(weights(pooled, 2), weights(pooled, 3)) > 100 * WEIGHT_ATOL
    rows = metrics(pooled)
    # every step sampled on the pool, with the weights of the updates before it
    assert [(r["workers"], r["worker_restarts"]) for r in rows[1:]] == [(1, 0)] * 3
    assert [r["policy_version"] for r in rows[1:]] == [0, 1, 2]
    assert [r["episodes"] for r in rows[1:]] == [16, 16, 16]
    trimmed = [{k: v for k, v in r.items() if k not in POOL_ONLY} for r in rows]
    assert_metrics_close(metrics(alone), trimmed)
    assert (pooled / "report.html").is_file()
