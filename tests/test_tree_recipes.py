"""The tree-rollout recipes train end to end (tiny budgets) and log valid, auditable records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import REPO
from turnrl.table import TurnTable
from turnrl.train.config import RunConfig, load_config
from turnrl.train.online.trainer import OnlineTrainer

torch.set_num_threads(1)
TINY = [
    "warm_start.steps=4",
    "warm_start.batch_size=8",
    "env.n_train_tasks=8",
    "env.n_eval_tasks=2",
    "env.env_kwargs={is_slippery = false, max_turns = 3}",
    "rollout.tasks_per_step=2",
    "policy.max_new_tokens=12",
    "train.steps=2",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    "train.minibatch_size=16",
    "train.eval_samples=1",
    "train.log_rollouts_every=1",
]


@pytest.mark.parametrize("strategy", ["independent", "patr", "rtpo"])
def test_tree_recipe_trains_and_logs_valid_records(tmp_path: Path, strategy: str) -> None:
    extra = ["rollout.params.skip_ties=false"] if strategy == "rtpo" else []
    config = load_config(
        RunConfig,
        REPO / "examples" / f"frozenlake_{strategy}.toml",
        [*TINY, *extra, f"run_dir={tmp_path}"],
    )
    run = OnlineTrainer(config, quiet=True).run()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    for key in ("tokens_all", "tokens_unique", "tokens_computed", "rollout_env_steps"):
        assert key in last, key
    assert last["tokens_unique"] <= last["tokens_all"]
    if strategy != "independent":  # prefix reuse: near the physical minimum
        minimum = last["tokens_unique"] + last.get("tokens_refresh", 0.0)
        assert last["tokens_computed"] <= 1.1 * minimum
    if strategy == "rtpo":
        assert last["updates"] >= 1
    # env_steps counts environment steps taken, not the copies of shared turns
    steps = [r for r in rows if "rollout_env_steps" in r]
    assert last["env_steps"] == sum(r["rollout_env_steps"] for r in steps)
    records = [
        json.loads(line)
        for line in (run / "rollouts" / "step-000002.jsonl").read_text().splitlines()
    ]
    table = TurnTable.from_records(records)  # trees are logged as valid trajectories
    assert table.n_rows == len(records) and all("advantage" in r for r in records)
