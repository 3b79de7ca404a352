"""``turnrl iterate`` over torchrun ranks (gloo on CPU, 2 ranks): it equals one process.

Rank 0 runs the whole loop (deploy, Q fit, candidates, evaluation); the improvement
step's PPO updates are spread over the ranks by task tree
(:mod:`turnrl.train.rank_zero`). Everything sampled is seeded from the config, so both
runs sample the same conversations and candidates as long as the weights agree.

Tolerance: after each of 2 iterations (a 3-step warm start, 2 improvement steps of 3
states x 2 candidates scored by Q, one mini-batch each) every weight agrees within
``WEIGHT_ATOL = 1e-5`` (measured: 3.7e-9 on weights of order 1) and every float metric
within a relative ``METRIC_RTOL = 1e-5`` (except the activation memory and positions
each process computed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, TINY_ITERATE
from launched import run_launcher
from test_distributed import (
    ENTRY,
    WEIGHT_ATOL,
    assert_metrics_close,
    environment,
    max_difference,
    weights,
)

RECIPE = REPO / "examples" / "iterate_haggle.toml"
TRAINS = ("improve.reject_malformed=false", "improve.minibatch_size=8")
"""Q scores every candidate (the tiny model's are all malformed, which would give every
candidate the same score and the update nothing to learn), and each improvement step
is one mini-batch of all its rows, so both ranks' trees are in every optimiser step."""
SPLIT_DEPENDENT = frozenset({"improve_update_activation_mib", "improve_update_tokens_computed"})
"""What each process computed (a prefix shared by trees on two ranks runs on both)."""


def iterate(run_dir: Path, ranks: int, *extra: str) -> subprocess.CompletedProcess[str]:
    """``turnrl iterate`` on ``ranks`` torchrun ranks (0: a plain process)."""
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
        if ranks
        else [sys.executable]
    )
    return run_launcher(
        [
            *launcher,
            str(ENTRY),
            "iterate",
            "--config",
            str(RECIPE),
            *TINY_ITERATE,
            "logging.report=true",
            *TRAINS,
            *extra,
            "--run-dir",
            str(run_dir),
            "--quiet",
        ],
        env=environment(),
        timeout=300,
    )


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if not k.startswith("seconds_") and k not in SPLIT_DEPENDENT}
        for r in rows
    ]


@pytest.mark.slow
def test_iterate_on_two_ranks_equals_one_process(tmp_path: Path) -> None:
    """In ``make test-slow`` only (#38: 73 s of the suite). ``make test`` covers it in
    parts: rank 0 running a whole loop and spreading each PPO update over the ranks by
    task tree (:mod:`turnrl.train.rank_zero`, the code path of the improvement step
    here) equals one process (tests/test_distributed_agent.py's
    ``test_agent_loop_on_two_ranks_equals_one_process``; the split itself,
    ``test_spread_trees_partitions_rows_by_whole_trees``), and the one-process
    ``turnrl iterate`` loop is tested in tests/test_iterate_loop.py."""
    one, two = tmp_path / "one", tmp_path / "two"
    for run_dir, ranks in ((one, 0), (two, 2)):
        done = iterate(run_dir, ranks)
        assert done.returncode == 0, done.stderr[-3000:]
    for step in (1, 2):
        assert max_difference(weights(one, step), weights(two, step)) <= WEIGHT_ATOL, step
    # not vacuous: the second iteration's improvement moved the weights beyond it
    assert max_difference(weights(two, 1), weights(two, 2)) > 10 * WEIGHT_ATOL
    rows = metrics(two)
    assert [r["step"] for r in rows] == [0, 1, 2]  # rank 0 alone wrote
    assert all(r["improve_grad_norm"] > 0 for r in rows[1:])
    assert_metrics_close(metrics(one), rows)
    assert (two / "report.html").is_file() and (two / "policy").is_dir()
    # the first iteration deployed the same conversations (same warm start, same seeds)
    deployed = "iter-001/deploy.jsonl"
    assert (one / deployed).read_text() == (two / deployed).read_text()
