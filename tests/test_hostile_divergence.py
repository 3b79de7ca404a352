"""A diverged update never poisons a run (issue 38).

``train.lr = 1e308`` (or ``1e30`` in the agent loop) used to log a NaN loss and grad
norm, save a checkpoint of non-finite tensors, and exit 0. Now the step is refused
before the optimiser applies it: one line naming the step, exit code 2, the last
checkpoint on disk is the step before (every tensor finite), and ``--resume``
continues from it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import PARITY, TINY_TRAIN
from test_hostile_run import agent_args, entry, error_lines, read_jsonl
from turnrl.cli import main as turnrl_main
from turnrl.policy import build_tiny_policy
from turnrl.train.checkpoint import list_checkpoints, load_checkpoint
from turnrl.train.config import PPOConfig
from turnrl.train.online.trainer import OnlineTrainer
from turnrl.train.process_tree import descendants
from turnrl.train.update.divergence import DivergedUpdateError
from turnrl.train.update.ppo import UpdateBatch, ppo_update
from turnrl.train.update.sft import TurnExample, supervised_warm_start

REPO = Path(__file__).resolve().parents[1]
CALCULATOR = str(REPO / "examples" / "calculator.toml")


def train_env(tmp_path: Path, *overrides: str, flags: tuple[str, ...] = ()) -> list[str]:
    run_dir = str(tmp_path / "run")
    return [
        "train",
        "--quiet",
        *flags,
        "--config",
        CALCULATOR,
        "--run-dir",
        run_dir,
        *TINY_TRAIN,
        *PARITY,
        *overrides,
    ]


def finite_checkpoint(path: Path) -> bool:
    """Whether every tensor of a checkpoint's model and optimiser state is finite."""
    payload = load_checkpoint(path)
    tensors = [t for t in payload["model"].values() if torch.is_tensor(t)]
    for state in payload["optimizer"]["state"].values():
        tensors += [t for t in state.values() if torch.is_tensor(t) and t.is_floating_point()]
    assert tensors
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1, err
    return err[0]


# --------------------------------------------------------------- the update itself


def batch_of(policy) -> UpdateBatch:
    """Two rows with advantages of both signs (a non-zero gradient)."""
    contexts = [[1, 2, 3], [1, 2, 4]]
    responses = [[5, 6], [7]]
    with torch.no_grad():
        logp, mask = policy.response_logprobs(contexts, responses)
    return UpdateBatch(
        contexts=contexts,
        responses=responses,
        old_logp_B_T=logp.detach() * mask,
        mask_B_T=mask,
        adv_B=torch.tensor([1.0, -1.0]),
        clip_factor_B=None,
        weight_B_T=mask / mask.sum(),
        tree_B=torch.tensor([0, 1]),
    )


def test_an_update_that_overflows_the_weights_is_refused_after_its_step() -> None:
    policy = build_tiny_policy(0)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e308, weight_decay=0.0)
    config = PPOConfig(epochs=1, minibatch_size=4, update="rows")
    with pytest.raises(DivergedUpdateError) as caught:
        ppo_update(
            policy, optimizer, batch_of(policy), config, temperature=1.0, reference=None, seed=0
        )
    tensors = len([p for p in policy.parameters() if p.requires_grad])
    assert str(caught.value).startswith(
        f"{tensors} of {tensors} weight tensors are not finite after the update's 1 "
        "optimiser steps: the update diverged"
    )
    assert str(caught.value.at_step(7)).startswith("step 7: ")


def test_a_nan_loss_is_refused_before_the_optimiser_step() -> None:
    """The second optimiser step's loss is NaN (the first overflowed the weights): the
    step is refused before ``optimizer.step`` runs, so it is never called twice."""
    policy = build_tiny_policy(0)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e308, weight_decay=0.0)
    steps = []
    optimizer.register_step_post_hook(lambda *_: steps.append(1))
    config = PPOConfig(epochs=2, minibatch_size=4, update="rows")
    with pytest.raises(DivergedUpdateError, match=r"^the loss of optimiser step 2 of the update"):
        ppo_update(
            policy, optimizer, batch_of(policy), config, temperature=1.0, reference=None, seed=0
        )
    assert steps == [1]


def test_a_diverging_warm_start_is_refused_naming_its_step() -> None:
    examples = [TurnExample([1, 2, 3], [4, 5]), TurnExample([1, 2], [6])]
    with pytest.raises(DivergedUpdateError, match=r"^the loss of warm start step 2 is nan"):
        supervised_warm_start(
            build_tiny_policy(0), examples, steps=3, lr=1e308, batch_size=2, seed=0
        )
    losses = supervised_warm_start(
        build_tiny_policy(0), examples, steps=3, lr=1e-3, batch_size=2, seed=0
    )
    assert len(losses) == 3


# -------------------------------------------------------------- whole runs, on the CLI


def test_train_lr_1e308_exits_2_at_step_1_and_saves_nothing_of_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = turnrl_main(train_env(tmp_path, "train.lr=1e308", "train.checkpoint_every=1"))
    line = one_line(capsys)
    assert code == 2
    assert line.startswith("turnrl train: error: step 1: the loss of optimiser step 2 of ")
    assert line.endswith(
        "the update diverged (a learning rate far too large?) and was not applied; "
        "nothing of step 1 is saved"
    )
    run_dir = tmp_path / "run"
    assert [row["step"] for row in read_jsonl(run_dir / "metrics.jsonl")] == [0]
    assert list_checkpoints(run_dir) == []


def test_a_step_that_diverges_keeps_the_last_finite_checkpoint_and_resume_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 2's update diverges (its learning rate is made 1e308): exit 2 naming step 2,
    the checkpoint of step 1 is the newest and finite; ``--resume`` redoes step 2."""
    update = OnlineTrainer.update

    def diverging(self, batch):
        if self.step == 2:
            for group in self.optimizer.param_groups:
                group["lr"] = 1e308
        return update(self, batch)

    monkeypatch.setattr(OnlineTrainer, "update", diverging)
    args = train_env(tmp_path, "train.steps=3", "train.checkpoint_every=1", "train.eval_every=3")
    code = turnrl_main(args)
    line = one_line(capsys)
    assert code == 2
    assert line.startswith("turnrl train: error: step 2: ")
    assert "diverged" in line
    run_dir = tmp_path / "run"
    assert [row["step"] for row in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1]
    saved = list_checkpoints(run_dir)
    assert [step for step, _ in saved] == [1]
    assert finite_checkpoint(saved[0][1])
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert all(row["loss"] == row["loss"] for row in rows[1:])  # no NaN loss logged
    monkeypatch.setattr(OnlineTrainer, "update", update)
    assert turnrl_main([*args, "--resume"]) == 0
    assert [row["step"] for row in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1, 2, 3]
    assert all(finite_checkpoint(path) for _, path in list_checkpoints(run_dir))


def test_the_agent_loop_with_lr_1e30_exits_2_naming_the_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = descendants()
    run_dir = tmp_path / "run"
    code = turnrl_main(
        agent_args(tmp_path, f"agent.entrypoint={entry('random_reward')}", "train.lr=1e30")
    )
    line = one_line(capsys)
    assert code == 2
    assert line.startswith("turnrl train: error: step 1: ")
    assert "the update diverged" in line
    assert [row["step"] for row in read_jsonl(run_dir / "metrics.jsonl")] == [0]
    assert list_checkpoints(run_dir) == []
    assert descendants() == before
