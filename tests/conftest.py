"""Shared settings of the tests' tiny training runs (seconds on one CPU core).

``tiny_train(run_dir, *overrides, recipe="calculator")`` and
``tiny_iterate(run_dir, *overrides)`` build validated configs of a few steps on a
small model; ``read_metrics(run_dir)`` reads a run's ``metrics.jsonl`` without the
machine-dependent ``seconds_*`` keys (what resume-equality checks compare).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from turnrl.envs import ENVS, EnvSpec, register_env
from turnrl.types import Env, Message, StepResult, Task

REPO = Path(__file__).resolve().parents[1]

torch.set_num_threads(1)

TINY_TRAIN = (
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
    "logging.report=false",
)
"""``turnrl train`` overrides: 4 steps of 2 tasks x 2 rollouts on the recipe's model, no
HTML report (about 4 s each; the tests of the report add ``logging.report=true``)."""

TINY_ITERATE = (
    "threads=1",
    "iterations=2",
    "env.n_train_tasks=8",
    "env.n_eval_tasks=2",
    "policy.hidden=16",
    "policy.layers=1",
    "policy.max_new_tokens=12",
    "warm_start.steps=3",
    "warm_start.batch_size=4",
    "deploy.tasks_per_iteration=2",
    "deploy.conversations_per_task=3",
    "deploy.temperatures=[1.0, 1.3]",
    "q.hidden=16",
    "q.layers=1",
    "q.steps=3",
    "q.batch_size=4",
    "improve.steps=2",
    "improve.states_per_step=3",
    "improve.candidates=2",
    "improve.minibatch_size=4",
    "logging.report=false",
)
"""``turnrl iterate`` overrides: 2 iterations of 6 conversations on a 1-layer model, no
HTML report (as ``TINY_TRAIN``)."""


class ParityEnv(Env):
    """Two turns; each pays ``len(response) % 2`` (the second pays double). Even an
    untrained model gets varied rewards, so advantages are never all zero."""

    def __init__(self) -> None:
        self.task: Task | None = None
        self.turn = 0

    def reset(self, task: Task) -> list[Message]:
        self.task, self.turn = task, 0
        return [
            {"role": "system", "content": "Reply."},
            {"role": "user", "content": f"task {task.payload['k']}"},
        ]

    def step(self, response: str) -> StepResult:
        self.turn += 1
        done = self.turn == 2
        reward = float(len(response) % 2) * self.turn
        observation = None if done else {"role": "user", "content": "again"}
        return StepResult(observation, reward, done, {"correct": reward > 0} if done else {})

    def snapshot(self) -> tuple[Task | None, int]:
        return self.task, self.turn

    def restore(self, snapshot: tuple[Task | None, int]) -> None:
        self.task, self.turn = snapshot

    def reference_response(self, task: Task) -> str | None:
        return "ok"


def parity_tasks(n: int, seed: int) -> list[Task]:
    return [Task(f"p{seed}-{i}", {"k": i}) for i in range(n)]


def parity_demonstration(task: Task) -> list[Message]:
    return [*ParityEnv().reset(task), {"role": "assistant", "content": "ok"}]


if "parity" not in ENVS:
    register_env("parity", EnvSpec(ParityEnv, parity_tasks, parity_demonstration))

PARITY = ("env.name=parity", "env.env_kwargs={}", "env.task_kwargs={}", "warm_start.steps=0")
"""Overrides that train on ``ParityEnv`` from the untrained model."""


@pytest.fixture
def tiny_train() -> Callable[..., Any]:
    """Factory of tiny ``RunConfig``s: ``tiny_train(run_dir, *overrides, recipe=...)``."""
    from turnrl.train.config import RunConfig, load_config

    def make(run_dir: Path, *extra: str, recipe: str = "calculator") -> RunConfig:
        return load_config(
            RunConfig,
            REPO / "examples" / f"{recipe}.toml",
            [*TINY_TRAIN, f"run_dir={run_dir}", *extra],
        )

    return make


@pytest.fixture
def tiny_iterate() -> Callable[..., Any]:
    """Factory of tiny ``IterateConfig``s on the haggle recipe."""
    from turnrl.train.config import load_config
    from turnrl.train.iterate.config import IterateConfig

    def make(run_dir: Path, *extra: str) -> IterateConfig:
        return load_config(
            IterateConfig,
            REPO / "examples" / "iterate_haggle.toml",
            [*TINY_ITERATE, f"run_dir={run_dir}", *extra],
        )

    return make


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    """A run's metrics rows without the ``seconds_*`` timings."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("seconds_")} for r in rows]


@pytest.fixture
def read_metrics() -> Callable[[Path], list[dict[str, Any]]]:
    """``read_metrics(run_dir)``: the run's metrics rows without timings."""
    return metrics_rows
