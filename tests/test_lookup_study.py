"""The lookup recipe trains end to end (information gain, anchor states); the study script runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("bm25s", reason="the lookup environment needs the 'lookup' extra (bm25s)")

from conftest import REPO
from turnrl.train.config import RunConfig, load_config
from turnrl.train.online.trainer import OnlineTrainer

TINY = [
    "warm_start.steps=4",
    "warm_start.batch_size=8",
    "env.n_train_tasks=8",
    "env.n_eval_tasks=3",
    "rollout.group_size=3",
    "rollout.tasks_per_step=2",
    "train.steps=1",
    "train.eval_every=1",
    "train.log_rollouts_every=1",
    "train.minibatch_size=16",
    "train.threads=1",
]


@pytest.mark.parametrize(
    ("estimator", "params"),
    [("a2tgpo", "{ig_norm = 'joint', rescale = false, beta = 0.0}"), ("gigpo", "{}")],
)
def test_recipe_trains_with_information_gain_and_anchor_states(
    tmp_path: Path, estimator: str, params: str
) -> None:
    config = load_config(
        RunConfig,
        REPO / "examples" / "lookup.toml",
        [*TINY, f"run_dir={tmp_path}", f"credit.estimator={estimator}", f"credit.params={params}"],
    )
    run = OnlineTrainer(config, quiet=True).run()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert {"eval_success", "eval_tool_calls", "tool_calls", "loss"} <= rows[1].keys()
    records = [
        json.loads(x) for x in (run / "rollouts" / "step-000001.jsonl").read_text().splitlines()
    ]
    assert len({r["traj_id"] for r in records}) == 6
    assert all(r["state_key"] for r in records)  # the env gives every turn an anchor state
    multi_turn = [r for r in records if r["turn"] > 0]
    if estimator == "a2tgpo" and multi_turn:  # every turn but a trajectory's last has IG
        last = {}
        for r in records:
            last[r["traj_id"]] = max(last.get(r["traj_id"], 0), r["turn"])
        with_ig = [r for r in records if r["turn"] < last[r["traj_id"]]]
        assert all(r["info_gain"] is not None for r in with_ig)


@pytest.mark.slow
def test_study_script_quick(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "examples/lookup/run.py", "--quick", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| a2tgpo_no_clip |" in done.stdout and "Advantage std" in done.stdout
    assert (tmp_path / "summary.md").read_text() in done.stdout
    for arm in ("grpo", "igpo", "a2tgpo_joint"):
        assert (tmp_path / arm / "seed0" / "checkpoints" / "step-000002.pt").exists()
