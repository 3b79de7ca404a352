"""Snapshot/restore round trips, for every registered environment, as tree rollouts use them:
a snapshot restored into a FRESH environment continues exactly like the original, the
snapshot stays reusable, and stepping a restored copy never disturbs the original."""

from __future__ import annotations

import pytest

from turnrl.envs import ENVS, FrozenLakeEnv, demonstration, make_env, make_tasks
from turnrl.types import Env, state_key_of


def outcome(env: Env, responses: list[str]) -> list[tuple]:
    """Everything observable from stepping ``responses`` (until the episode ends)."""
    seen = []
    for response in responses:
        result = env.step(response)
        info = {k: v for k, v in result.info.items() if isinstance(v, (str, int, float, bool))}
        seen.append((result.observation, result.reward, result.done, info, state_key_of(env)))
        if result.done:
            break
    return seen


def agent_turns(name: str, task) -> list[str]:
    """The assistant responses of the environment's demonstration."""
    return [m["content"] for m in demonstration(name, task) if m["role"] == "assistant"]


@pytest.mark.parametrize("name", sorted(ENVS))
def test_restoring_into_a_fresh_environment_continues_identically(name: str) -> None:
    for task in make_tasks(name, 3, seed=11):
        responses = agent_turns(name, task)
        for cut in range(len(responses)):
            env = make_env(name)
            env.reset(task)
            outcome(env, responses[:cut])
            snapshot = env.snapshot()
            key = state_key_of(env)
            copies = [make_env(name) for _ in range(2)]
            for copy in copies:
                copy.restore(snapshot)
                assert state_key_of(copy) == key
            first = outcome(copies[0], responses[cut:])
            assert outcome(copies[1], responses[cut:]) == first  # the snapshot is reusable
            assert state_key_of(env) == key  # the original was not touched
            assert outcome(env, responses[cut:]) == first
            env.restore(snapshot)  # back to the branch point after the episode went on
            assert state_key_of(env) == key and outcome(env, responses[cut:]) == first


def test_slippery_frozenlake_snapshots_carry_the_random_stream() -> None:
    (task,) = make_tasks("frozenlake", 1, seed=5)
    moves = ["<answer>right</answer>", "<answer>down</answer>"] * 6
    env = FrozenLakeEnv(is_slippery=True, max_turns=16)
    env.reset(task)
    outcome(env, moves[:2])
    snapshot = env.snapshot()
    branches = []
    for _ in range(3):
        branch = FrozenLakeEnv(is_slippery=True, max_turns=16)
        branch.restore(snapshot)
        branches.append(outcome(branch, moves[2:]))
    assert branches[0] == branches[1] == branches[2] == outcome(env, moves[2:])
