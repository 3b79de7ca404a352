"""The online trainer: resume equality, recipe smoke runs, estimators end to end, and the
wiring of the update (sampling temperature, KL reference, aggregation, A2TGPO) checked
on real numbers of tiny runs."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import PARITY, REPO, TINY_TRAIN
from turnrl.cli import main
from turnrl.credit import compute_credit
from turnrl.envs import make_env
from turnrl.policy import HFPolicy
from turnrl.records import parse_record
from turnrl.table import TurnTable
from turnrl.train.online.trainer import OnlineTrainer
from turnrl.train.run import task_split
from turnrl.train.update.info_gain import add_information_gain

ONE_UPDATE = ("train.epochs=1", "train.minibatch_size=64")
"""One optimiser step per training step: its first (only) mini-batch is on-policy."""


def records(run_dir: Path, step: int) -> list[dict]:
    path = run_dir / "rollouts" / f"step-{step:06d}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_resumed_run_equals_uninterrupted_run(tmp_path: Path, tiny_train, read_metrics) -> None:
    """3 steps straight, or stopped after the checkpoint of step 2 and resumed: the same
    metrics and final weights."""
    settings = ("train.kl_coef=0.05", "train.steps=3")
    straight = OnlineTrainer(tiny_train(tmp_path / "a", *settings), quiet=True).run()
    crashed = tmp_path / "b"
    OnlineTrainer(tiny_train(crashed, *settings), quiet=True).run(stop_after=2)
    assert len(read_metrics(crashed)) == 3  # step 0 eval, steps 1 and 2
    # a crash mid-write leaves a partial line; resuming must cope with it
    with open(crashed / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 3, "succ')
    config = tiny_train(crashed, *settings)
    resumed = OnlineTrainer(config, resume=True, quiet=True).run()
    assert read_metrics(resumed) == read_metrics(straight)
    assert [row["step"] for row in read_metrics(resumed)] == [0, 1, 2, 3]
    a = torch.load(straight / "checkpoints" / "step-000003.pt", weights_only=True)["model"]
    b = torch.load(resumed / "checkpoints" / "step-000003.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("estimator", ["grpo_mixed", "turn_group", "node", "gigpo", "rloo"])
def test_estimators_train_end_to_end(
    tmp_path: Path, tiny_train, read_metrics, estimator: str
) -> None:
    config = tiny_train(
        tmp_path,
        f"credit.estimator={estimator}",
        "train.steps=1",
        "train.log_rollouts_every=1",
        *ONE_UPDATE,
    )
    run = OnlineTrainer(config, quiet=True).run()
    (last,) = [m for m in read_metrics(run) if m["step"] == 1]
    assert last["episodes"] == 4 and last["loss"] == pytest.approx(last["pg_loss"])
    # the logged advantages are the estimator's on the logged records
    logged = records(run, 1)
    expected = compute_credit(TurnTable.from_records(logged), estimator).advantages
    assert [r["advantage"] for r in logged] == pytest.approx(expected.tolist(), abs=1e-12)


def expected_pg_loss(rows: list[dict], mode: str) -> float:
    """The PPO loss of one on-policy step (ratio 1): ``-sum_b A_b * sum_t w[b, t]``."""
    rows = [r for r in rows if r["response_ids"] and r.get("train", True)]
    length = np.array([len(r["response_ids"]) for r in rows], dtype=float)
    adv = np.array([r["advantage"] for r in rows])
    if mode == "token-mean":
        weight = length / length.sum()
    elif mode == "seq-mean-token-mean":
        weight = np.full(len(rows), 1.0 / len(rows))
    else:  # rollout-mean: each rollout 1/R, shared equally by all its tokens
        traj = [r["traj_id"] for r in rows]
        tokens = {t: sum(n for n, u in zip(length, traj, strict=True) if u == t) for t in traj}
        weight = np.array([n / tokens[t] / len(tokens) for n, t in zip(length, traj, strict=True)])
    return float(-(weight * adv).sum())


def _distinct_prefixes(sequences: list[list[int]]) -> int:
    """Size of the token trie of ``sequences``: how many distinct non-empty prefixes."""
    return len({tuple(s[:k]) for s in sequences for k in range(1, len(s) + 1)})


@pytest.mark.parametrize("update", ["tree", "rows"])
def test_step_metrics_log_the_update_tokens_and_memory(
    tmp_path: Path, tiny_train, read_metrics, update: str
) -> None:
    config = tiny_train(
        tmp_path,
        f"train.update={update}",
        "train.max_tokens_per_batch=100000",  # one forward: computed = the batch's trie
        "train.steps=1",
        "train.log_rollouts_every=1",
        *ONE_UPDATE,
    )
    run = OnlineTrainer(config, quiet=True).run()
    (row,) = [m for m in read_metrics(run) if m["step"] == 1]
    trained = [r for r in records(run, 1) if r["response_ids"] and r.get("train", True)]
    sequences = [[*r["prompt_ids"], *r["response_ids"]] for r in trained]
    by_task: dict[str, list[list[int]]] = {}
    for r, sequence in zip(trained, sequences, strict=True):
        by_task.setdefault(r["task_id"], []).append(sequence)
    assert row["update_tokens_rows"] == sum(len(s) for s in sequences)
    assert row["update_tokens_unique"] == sum(_distinct_prefixes(t) for t in by_task.values())
    # tree: one forward over every task's rows, so tasks share their common prompt too
    if update == "tree":
        assert row["update_tokens_computed"] == _distinct_prefixes(sequences)
        assert row["update_tokens_computed"] < row["update_tokens_rows"]
    else:  # every row in full, packed into bins up to the longest row (tails padded)
        assert row["update_tokens_computed"] >= row["update_tokens_rows"]
        assert row["update_tokens_computed"] <= len(sequences) * max(map(len, sequences))
    assert row["update_activation_mib"] > 0


def test_aggregation_modes_weigh_rows_as_documented(tmp_path: Path, tiny_train, read_metrics):
    losses = {}
    for mode in ("token-mean", "seq-mean-token-mean", "rollout-mean"):
        config = tiny_train(
            tmp_path / mode,
            f"train.aggregation={mode}",
            "train.steps=1",
            "train.log_rollouts_every=1",
            "credit.estimator=turn_group",  # per-turn advantages: the modes differ
            "rollout.group_size=4",
            *PARITY,
            *ONE_UPDATE,
        )
        run = OnlineTrainer(config, quiet=True).run()
        (row,) = [m for m in read_metrics(run) if m["step"] == 1]
        losses[mode] = row["pg_loss"]
        assert row["pg_loss"] == pytest.approx(expected_pg_loss(records(run, 1), mode), abs=2e-6)
        assert row["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    # the same rollouts (same seed, same warm start) weighed three ways
    assert len({round(v, 6) for v in losses.values()}) == 3, losses


def test_update_uses_the_sampling_temperature_and_the_warm_start_as_kl_reference(
    tmp_path: Path, tiny_train, read_metrics
) -> None:
    def run(name: str, kl_coef: float) -> Path:
        config = tiny_train(
            tmp_path / name,
            "policy.temperature=0.7",
            f"train.kl_coef={kl_coef}",
            *PARITY,
            "train.steps=2",
            "train.log_rollouts_every=1",
            *ONE_UPDATE,
        )
        return OnlineTrainer(config, quiet=True).run()

    with_kl = run("kl", 0.5)
    first, second = (m for m in read_metrics(with_kl) if m["step"] in (1, 2))
    # Step 1's only mini-batch is on-policy at the sampling temperature 0.7.
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert abs(first["approx_kl_old"]) < 1e-6
    # The reference is the warm start: zero KL before the first update, not after it.
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-6)
    assert second["kl_ref"] > 1e-6
    assert second["kl_loss"] == pytest.approx(0.5 * second["kl_ref"], rel=1e-3)
    # kl_coef > 0 changes the update (step 1 is identical: KL and its gradient are 0).
    without = run("plain", 0.0)
    assert records(without, 1) == records(with_kl, 1)
    a = torch.load(with_kl / "checkpoints" / "step-000002.pt", weights_only=True)["model"]
    b = torch.load(without / "checkpoints" / "step-000002.pt", weights_only=True)["model"]
    assert not all(torch.equal(a[k], b[k]) for k in a)


def test_a2tgpo_end_to_end_information_gain_advantages_and_clip_factor(
    tmp_path: Path, tiny_train, read_metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    import turnrl.train.online.trainer as online

    seen = []
    original = online.ppo_update

    def spy(policy, optimizer, batch, config, **kwargs):
        seen.append(batch)
        return original(policy, optimizer, batch, config, **kwargs)

    monkeypatch.setattr(online, "ppo_update", spy)
    config = tiny_train(
        tmp_path,
        "credit.estimator=a2tgpo",
        *PARITY,
        "train.steps=1",
        "train.log_rollouts_every=1",
        *ONE_UPDATE,
    )
    run = OnlineTrainer(config, quiet=True).run()
    logged = records(run, 1)
    # IG as logged equals IG recomputed with the policy of step 1 (the warm start).
    env = make_env(config.env.name, **config.env.env_kwargs)
    tasks = {t.task_id: t for t in task_split(config.env).train}
    fresh = [
        parse_record({k: v for k, v in r.items() if k not in ("info_gain", "advantage")})
        for r in logged
    ]
    warm = HFPolicy.from_pretrained(run / "warm_start")
    added = add_information_gain(warm, fresh, lambda t: env.reference_response(tasks[t]))
    assert any(r.info_gain is not None for r in added)
    assert [r.info_gain for r in added] == pytest.approx(
        [r.get("info_gain") for r in logged], abs=1e-5
    )
    # The logged advantages are a2tgpo's on the logged IG, and its clip factor reached
    # the update, row for row.
    credit = compute_credit(TurnTable.from_records(logged), "a2tgpo")
    assert [r["advantage"] for r in logged] == pytest.approx(credit.advantages.tolist(), abs=1e-9)
    (batch,) = seen
    kept = [i for i, r in enumerate(logged) if r["response_ids"] and r.get("train", True)]
    assert batch.clip_factor_B is not None
    assert batch.clip_factor_B.tolist() == pytest.approx(credit.clip_factor[kept].tolist())
    assert not np.allclose(credit.clip_factor[kept], 1.0)  # the factor varies by IG
    (row,) = [m for m in read_metrics(run) if m["step"] == 1]
    turn0 = [r["advantage"] for r in logged if r["turn"] == 0]
    assert row["adv_mean_turn0"] == pytest.approx(float(np.mean(turn0)), abs=1e-9)


SMOKE_EXTRA = {
    "calculator": [],
    # short episodes and larger mini-batches keep the CPU smoke run to seconds
    "frozenlake": [
        "env.env_kwargs={is_slippery = false, max_turns = 3}",
        "train.minibatch_size=16",
    ],
}


def check_recipe_run(run_dir: Path, stdout: str) -> None:
    """What a tiny ``turnrl train`` of a recipe (2 steps or more) leaves: the held-out
    table and the report line printed, its files, the rollouts of step 2 logged with
    their advantages, and those rollouts valid turn records for ``turnrl audit`` (run
    in this process)."""
    assert "Held-out evaluation" in stdout and "report:" in stdout
    for name in ("config.toml", "metrics.jsonl", "report.html", "warm_start/config.json"):
        assert (run_dir / name).exists(), name
    logged = records(run_dir, 2)
    assert logged and "advantage" in logged[0]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["audit", str(run_dir / "rollouts" / "step-000002.jsonl")])
    assert code == 0 and "Group keys" in printed.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["calculator", "frozenlake"])
def test_recipe_smoke_run_via_cli(tmp_path: Path, recipe: str) -> None:
    """``python -m turnrl.cli train`` of the recipe (2 steps: the rollouts of step 2 are
    logged), checked by :func:`check_recipe_run`.

    In ``make test-slow`` only (#38: 53 s of the suite). ``make test`` covers it:
    ``test_plain_logs.py::test_piped_run_logs_each_phase_and_step`` runs the same tiny
    calculator recipe through ``python -m turnrl.cli train`` (not quiet, one epoch a step)
    and makes the same checks (:func:`check_recipe_run`);
    ``test_tree_recipes.py::test_tree_recipe_trains_and_logs_valid_records[independent]``
    trains a FrozenLake recipe (independent sampling, as here) 2 steps and checks its
    logged step-2 records (valid, with advantages); ``test_validate.py``'s
    ``test_every_example_config_is_valid`` validates ``examples/frozenlake.toml``."""
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
            *TINY_TRAIN,
            "train.steps=2",
            "logging.report=true",
            *SMOKE_EXTRA[recipe],
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    check_recipe_run(run_dir, done.stdout)
