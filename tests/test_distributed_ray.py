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

import os
from pathlib import Path

import pytest

from conftest import REPO
from launched import run_launcher
from test_distributed import (
    WEIGHT_ATOL,
    assert_metrics_close,
    command,
    environment,
    max_difference,
    metrics,
    weights,
)

pytest.importorskip("ray", reason="the ray extra is not installed")

TREE = ("train.update=tree", "env.name=parity_env:spec")
"""The parity environment by a name Ray workers import (tests/parity_env.py)."""
POOL_ONLY = ("workers", "worker_restarts", "policy_version")
"""Metrics only a step sampled on a pool reports."""


def train(run_dir: Path, ranks: int, *extra: str) -> None:
    """The CLI on ``ranks`` torchrun ranks, with tests/ on the path of every process it
    starts (the Ray workers import the environment from there)."""
    env = environment()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), env["PYTHONPATH"]])
    done = run_launcher(command(run_dir, ranks, *extra), env=env, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 ranks sampling themselves: the reference."""
    run_dir = tmp_path_factory.mktemp("ray") / "alone"
    train(run_dir, 2, *TREE)
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["none", "fsdp2"])
def test_two_ranks_with_a_ray_worker_equal_two_ranks(
    alone: Path, tmp_path: Path, sharding: str
) -> None:
    """With ``fsdp2`` rank 0 pushes the whole copy it gathered after each step.

    In ``make test-slow`` only (#38: 134 s of the suite, three 2-rank launches).
    ``make test`` covers it in parts: a Ray pool samples what the in-process runner
    samples, with the weights pushed to it (tests/test_ray_workers.py's
    ``test_pool_equals_the_in_process_runner``,
    ``test_pushed_weights_are_used_and_versions_increase``), a trainer pushes its weights
    to its pool after every update and logs the pool's metrics
    (``test_trainer_pushes_weights_to_its_pool_after_every_update``,
    ``test_metrics_record_workers_restarts_and_policy_version``), rank 0 hands each rank
    its share by scatter (tests/test_distributed.py's
    ``test_collectives_on_two_gloo_ranks``), and 2 ranks sampling themselves equal one
    process (``test_two_ranks_equal_one_process``)."""
    pooled = tmp_path / "pooled"
    train(pooled, 2, *TREE, "rollout.workers=1", f"train.sharding={sharding}")
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
