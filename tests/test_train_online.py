"""The online trainer: resume equality, recipe smoke runs, estimators end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from turnrl.train.config import RunConfig, load_config
from turnrl.train.online import TIMING_KEYS, OnlineTrainer

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "warm_start.steps=6",
    "warm_start.batch_size=8",
    "env.n_train_tasks=16",
    "env.n_eval_tasks=4",
    "rollout.group_size=2",
    "rollout.tasks_per_step=2",
    "policy.max_new_tokens=12",
    "train.steps=4",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    "train.minibatch_size=4",
    "train.epochs=2",
    "train.threads=1",
    "train.log_rollouts_every=2",
]


def config(run_dir: Path, *extra: str, recipe: str = "calculator") -> RunConfig:
    return load_config(
        RunConfig, REPO / "examples" / f"{recipe}.toml", [*TINY, f"run_dir={run_dir}", *extra]
    )


def metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def test_resumed_run_equals_uninterrupted_run(tmp_path: Path) -> None:
    straight = OnlineTrainer(config(tmp_path / "a", "train.kl_coef=0.05"), quiet=True).run()
    crashed = tmp_path / "b"
    OnlineTrainer(config(crashed, "train.kl_coef=0.05"), quiet=True).run(stop_after=2)
    assert len(metrics(crashed)) == 3  # step 0 eval, steps 1 and 2
    # a crash mid-write leaves a partial line; resuming must cope with it
    with open(crashed / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 3, "succ')
    resumed = OnlineTrainer(config(crashed, "train.kl_coef=0.05"), resume=True, quiet=True).run()
    assert metrics(resumed) == metrics(straight)
    a = torch.load(straight / "checkpoints" / "step-000004.pt", weights_only=True)["model"]
    b = torch.load(resumed / "checkpoints" / "step-000004.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "estimator", ["grpo_mixed", "turn_group", "node", "gigpo", "rloo", "a2tgpo"]
)
def test_estimators_train_end_to_end(tmp_path: Path, estimator: str) -> None:
    run = OnlineTrainer(
        config(tmp_path, f"credit.estimator={estimator}", "train.steps=1", "train.epochs=1"),
        quiet=True,
    ).run()
    (last,) = [m for m in metrics(run) if m["step"] == 1]
    assert last["episodes"] == 4 and "adv_mean_turn0" in last and "loss" in last


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "rollout-mean"])
def test_aggregation_modes_run(tmp_path: Path, aggregation: str) -> None:
    run = OnlineTrainer(
        config(tmp_path, f"train.aggregation={aggregation}", "train.steps=1"), quiet=True
    ).run()
    assert (run / "checkpoints" / "step-000001.pt").exists()


SMOKE_EXTRA = {
    "calculator": [],
    # short episodes and larger mini-batches keep the CPU smoke run to seconds
    "frozenlake": [
        "env.env_kwargs={is_slippery = false, max_turns = 3}",
        "train.minibatch_size=16",
    ],
}


@pytest.mark.parametrize("recipe", ["calculator", "frozenlake"])
def test_recipe_smoke_run_via_cli(tmp_path: Path, recipe: str) -> None:
    run_dir = tmp_path / recipe
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "turnrl.cli",
            "train",
            "--config",
            f"examples/{recipe}.toml",
            "--quiet",
            "--run-dir",
            str(run_dir),
            *TINY,
            *SMOKE_EXTRA[recipe],
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Held-out evaluation" in done.stdout and "report:" in done.stdout
    for name in ("config.toml", "metrics.jsonl", "report.html", "warm_start/config.json"):
        assert (run_dir / name).exists(), name
    records = (run_dir / "rollouts" / "step-000002.jsonl").read_text().splitlines()
    assert records and "advantage" in json.loads(records[0])
    # the logged rollouts are valid turn records for the audit
    audit = subprocess.run(
        [
            sys.executable,
            "-m",
            "turnrl.cli",
            "audit",
            str(run_dir / "rollouts" / "step-000002.jsonl"),
        ],
        capture_output=True,
        text=True,
    )
    assert audit.returncode == 0 and "Group keys" in audit.stdout


def test_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nlearning_rate = 1\n")
    done = subprocess.run(
        [sys.executable, "-m", "turnrl.cli", "train", "--config", str(bad)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "bad.toml:2" in done.stderr and "learning_rate" in done.stderr


def test_zero_periods_mean_only_at_the_end(tmp_path: Path) -> None:
    run = OnlineTrainer(
        config(
            tmp_path, "train.eval_every=0", "train.checkpoint_every=0", "train.log_rollouts_every=0"
        ),
        quiet=True,
    ).run()
    evaluated = [m["step"] for m in metrics(run) if "eval_success" in m]
    assert evaluated == [0, 4]
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*.pt")) == ["step-000004.pt"]
    assert not (run / "rollouts").exists()


def test_update_batch_leaves_out_copies_and_empty_responses() -> None:
    import numpy as np

    from turnrl.table import TurnTable
    from turnrl.train.online import build_update_batch

    def row(traj: str, turn: int, response: list[int], **extra) -> dict:
        return {
            "task_id": "t",
            "traj_id": traj,
            "turn": turn,
            "prompt_ids": [1, turn],
            "response_ids": response,
            "logprobs": [-0.5] * len(response),
            **extra,
        }

    records = [
        row("a", 0, [5, 6]),
        row("b", 0, [5, 6], copy_of="a", train=False),  # a tree's shared turn
        row("a", 1, [7]),
        row("b", 1, []),  # nothing sampled
    ]
    table = TurnTable.from_records(records)
    batch = build_update_batch(records, table, np.array([1.0, 2.0, 3.0, 4.0]), None, "token-mean")
    assert batch.responses == [[5, 6], [7]]
    assert batch.contexts == [[1, 0], [1, 1]]
    assert batch.adv_B.tolist() == [1.0, 3.0]
    with pytest.raises(ValueError, match="no record to update on"):
        build_update_batch(records[1:2] + records[3:], table, np.zeros(2), None, "token-mean")
