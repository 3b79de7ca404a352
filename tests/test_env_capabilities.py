"""Optional environment capabilities (``turnrl.types``): an environment has one by
defining its methods; code that needs one names it when it is missing; code that can
do without one treats its absence as before (no state key, a cut response stepped as
any, every response well formed). The built-in environments keep every capability
they had."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnrl.envs import ENVS, EnvSpec, make_env, register_env
from turnrl.errors import CapabilityError, ConfigError
from turnrl.policy import build_tiny_policy
from turnrl.rollout import run_episodes
from turnrl.rollout.runner import start_episode
from turnrl.rollout.tree import clone_episode
from turnrl.train.config import RunConfig, load_config
from turnrl.train.iterate.explore import PersonaEnv
from turnrl.train.validate import validate
from turnrl.types import (
    Env,
    Message,
    References,
    ResponseChecks,
    Snapshots,
    StateKeys,
    StepResult,
    Task,
    Truncation,
    require,
    state_key_of,
)


class BareEnv(Env):
    """Only ``reset`` and ``step``: one turn, reward 1 for a response that says "yes"."""

    def __init__(self) -> None:
        self.stepped: list[str] = []

    def reset(self, task: Task) -> list[Message]:
        return [{"role": "user", "content": f"say yes ({task.task_id})"}]

    def step(self, response: str) -> StepResult:
        self.stepped.append(response)
        return StepResult(None, float("yes" in response), True, {})


def bare_tasks(n: int, seed: int) -> list[Task]:
    return [Task(f"b{seed}-{i}", {}) for i in range(n)]


def bare_demonstration(task: Task) -> list[Message]:
    return [*BareEnv().reset(task), {"role": "assistant", "content": "yes"}]


@pytest.fixture
def bare_registered():
    register_env("bare", EnvSpec(BareEnv, bare_tasks, bare_demonstration))
    yield "bare"
    del ENVS["bare"]


CAPABILITY_TYPES = (Snapshots, StateKeys, References, ResponseChecks, Truncation)


def test_a_bare_env_has_no_capability_and_builtins_keep_theirs() -> None:
    assert [isinstance(BareEnv(), c) for c in CAPABILITY_TYPES] == [False] * 5
    assert [isinstance(make_env("calculator"), c) for c in CAPABILITY_TYPES] == [True] * 5
    lake = make_env("frozenlake")
    assert [isinstance(lake, c) for c in CAPABILITY_TYPES] == [True, True, False, True, False]


def test_require_names_the_missing_capability() -> None:
    env = make_env("calculator")
    assert require(env, Snapshots, "x") is env
    with pytest.raises(CapabilityError) as error:
        require(BareEnv(), Snapshots, "a tree rollout (branching from a saved state)")
    assert str(error.value) == (
        "a tree rollout (branching from a saved state) needs an environment with snapshots "
        "(snapshot() and restore(snapshot)); BareEnv has none"
    )


def test_a_bare_env_runs_independent_rollouts_and_refuses_to_branch() -> None:
    policy = build_tiny_policy(0)
    tasks = bare_tasks(2, 0)
    made: list[BareEnv] = []

    def make() -> BareEnv:
        made.append(BareEnv())
        return made[-1]

    batch = run_episodes(
        policy, make, tasks, group_size=2, max_new_tokens=3, temperature=1.0, seed=0
    )
    assert len(batch.records) == 4
    assert all(r.state_key is None for r in batch.records)
    # Every response, cut at the token limit or not, goes through step() (no Truncation).
    assert [len(env.stepped) for env in made] == [1, 1, 1, 1]
    assert [r.response for r in batch.records] == [s for env in made for s in env.stepped]
    episode = start_episode(policy, BareEnv, tasks[0], "t0", None)
    with pytest.raises(CapabilityError, match="needs an environment with snapshots"):
        clone_episode(episode, BareEnv, "t1")


def test_a_wrapped_bare_env_falls_back_as_before() -> None:
    wrapped = PersonaEnv(BareEnv(), "Think first.")
    task = bare_tasks(1, 0)[0]
    wrapped.reset(task)
    assert state_key_of(wrapped) is None
    assert wrapped.reference_response(task) is None
    assert wrapped.check_response(task, "anything") is None
    assert wrapped.step_truncated("ye").reward == 0.0
    assert wrapped.inner.stepped == ["ye"]
    with pytest.raises(CapabilityError, match="persona environment's snapshot needs"):
        wrapped.snapshot()


def test_strategies_and_estimators_that_need_a_capability_are_config_errors(
    tmp_path: Path, bare_registered: str
) -> None:
    base = [f"env.name={bare_registered}", "env.env_kwargs={}", "env.task_kwargs={}"]
    config = load_config(
        RunConfig, None, [*base, "rollout.strategy=patr", "credit.estimator=a2tgpo"]
    )
    with pytest.raises(ConfigError) as error:
        validate(config)
    assert dict(error.value.problems) == {
        "rollout.strategy": "'patr' needs an environment with snapshots (snapshot() and "
        "restore(snapshot)); 'bare' (BareEnv) has none",
        "credit.estimator": "'a2tgpo' needs an environment with reference responses "
        "(reference_response(task)); 'bare' (BareEnv) has none",
    }
    validate(load_config(RunConfig, None, base))  # independent rollouts, grpo: fine
