"""A success flag that is not a bool or 0/1, and a NaN reward, never count (issue 38).

``info.success = "false"`` with reward 0 used to be a success (``bool("false")``);
an environment's ``info["correct"]`` likewise. Now the agent's rollout fails naming
the field, and an environment's run stops with one line naming the environment, the
task and the field (exit code 2). A NaN reward is outside every range check.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import TINY_TRAIN, ParityEnv, parity_demonstration, parity_tasks
from serve_scripted import serving
from test_hostile_run import (
    entry,
    error_lines,
    records_with_rewards,
    run_batch,
    tasks,
)
from turnrl.cli import main as turnrl_main
from turnrl.envs import ENVS, EnvSpec, register_env
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.rollout.success import SuccessFlagError, success_flag
from turnrl.serve import Gateway, GatewayServer
from turnrl.table import TurnTable
from turnrl.train.agent.contract import AgentFailed, check_reward_range
from turnrl.train.agent.programs import make_program
from turnrl.train.agent.rollouts import RolloutSummary, rollout_metrics
from turnrl.train.process_tree import descendants
from turnrl.train.update.credit_check import CreditOverflowError, check_finite_credit
from turnrl.types import StepResult

REPO = Path(__file__).resolve().parents[1]
STRING_SUCCESS = "info.success must be a bool or 0/1 (None: no verdict), got 'false' (str)"


# --------------------------------------------------------------------- the rule itself


@pytest.mark.parametrize(
    ("value", "flag"),
    [
        (True, True),
        (False, False),
        (1, True),
        (0, False),
        (1.0, True),
        (0.0, False),
        (np.bool_(True), True),
        (np.int64(0), False),
        (np.float32(1), True),
        (None, None),
    ],
)
def test_bools_and_0_1_are_success_flags(value: Any, flag: bool | None) -> None:
    assert success_flag(value, "x") is flag


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("false", "'false' (str)"),
        ("True", "'True' (str)"),
        (2, "2 (int)"),
        (0.5, "0.5 (float)"),
        (math.nan, "nan (float)"),
        ([1], "[1] (list)"),
        ({}, "{} (dict)"),
    ],
)
def test_anything_else_is_refused_naming_where(value: Any, shown: str) -> None:
    with pytest.raises(SuccessFlagError) as refused:
        success_flag(value, "environment E (task t): info['correct']")
    assert str(refused.value) == (
        f"environment E (task t): info['correct'] must be a bool or 0/1 (None: no verdict), "
        f"got {shown}"
    )


# ------------------------------------------------------------------------- agents


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    return build_tiny_policy(0)


@pytest.fixture
def served(policy: HFPolicy) -> Iterator[tuple[Gateway, GatewayServer]]:
    with serving(policy, default_max_tokens=4, batch_window_s=0.001) as pair:
        yield pair


def test_an_agent_reporting_success_false_as_a_string_fails_its_rollout(
    served: tuple[Gateway, GatewayServer], tmp_path: Path
) -> None:
    before = descendants()
    results = run_batch(
        served, make_program(entry("string_success"), None), tasks(2), failure_dir=tmp_path
    )
    assert [r.failure.reason for r in results] == [STRING_SUCCESS, STRING_SUCCESS]
    assert [r.records for r in results] == [[], []]
    assert f"failure: {STRING_SUCCESS}" in (tmp_path / "r0.txt").read_text()
    metrics = rollout_metrics(results)
    assert metrics == {"agent_failures": 2.0}  # no success counted
    assert descendants() == before


def test_an_agent_reporting_success_0_or_1_is_counted_as_it_says(
    served: tuple[Gateway, GatewayServer],
) -> None:
    results = run_batch(served, make_program(entry("numeric_success"), None), tasks(4))
    assert [r.failure for r in results] == [None] * 4
    assert [RolloutSummary.of(r).correct for r in results] == [False, True, False, True]
    assert rollout_metrics(results)["success"] == 0.5


# -------------------------------------------------------------------- environments


class StringSuccessEnv(ParityEnv):
    """Parity, but its final ``info["correct"]`` is the string ``"false"``."""

    def step(self, response: str) -> StepResult:
        result = super().step(response)
        if result.done:
            return StepResult(result.observation, 0.0, True, {"correct": "false"})
        return result


if "string_success" not in ENVS:
    register_env("string_success", EnvSpec(StringSuccessEnv, parity_tasks, parity_demonstration))


def test_an_environment_reporting_correct_as_a_string_stops_the_run_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    code = turnrl_main(
        [
            "train",
            "--quiet",
            "--config",
            str(REPO / "examples" / "calculator.toml"),
            "--run-dir",
            str(run_dir),
            *TINY_TRAIN,
            "env.name=string_success",
            "env.env_kwargs={}",
            "env.task_kwargs={}",
            "warm_start.steps=0",
        ]
    )
    err = error_lines(capsys.readouterr().err)
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith("turnrl train: error: environment StringSuccessEnv (task p")
    assert err[0].endswith(
        "info['correct'] must be a bool or 0/1 (None: no verdict), got 'false' (str)"
    )
    assert not (run_dir / "metrics.jsonl").exists()  # the step-0 evaluation stopped
    assert not (run_dir / "checkpoints").exists()


# ------------------------------------------------------------------- a NaN reward


def test_a_nan_reward_fails_the_range_check() -> None:
    with pytest.raises(AgentFailed, match=r"^the reward nan is outside the accepted range"):
        check_reward_range(math.nan)
    assert check_reward_range(-1e6) == -1e6


def test_a_nan_reward_is_refused_before_the_update() -> None:
    """Records refuse a NaN reward when read; the last check before the update must
    too (a table built some other way, or a reward turned NaN in between)."""
    records = records_with_rewards([[0.5], [0.0]])
    table = TurnTable.from_records(records)
    table.reward[1] = math.nan
    with pytest.raises(CreditOverflowError) as refused:
        check_finite_credit(table, np.zeros(len(records)))
    assert str(refused.value).startswith(
        "refusing the update: the reward of rollout roll-1 (task q, turn 0) is nan (1 of 2 rows)"
    )
