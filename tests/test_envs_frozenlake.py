"""FrozenLakeEnv: rendering, moves, rewards, snapshots and BFS demonstrations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import turnrl.envs as envs
from turnrl.envs.frozenlake import (
    FrozenLakeEnv,
    demonstration,
    frozenlake_tasks,
    map_id,
    render_board,
    shortest_path,
    strip_ansi,
)
from turnrl.types import Task

ROWS = ("SFFF", "FHFH", "FFFH", "HFFG")
LAKE = Task(task_id=map_id(ROWS), payload={"map": ROWS, "size": 4, "seed": 3})


def test_render_board_plain_text() -> None:
    assert render_board(ROWS, 0) == "PFFF\nFHFH\nFFFH\nHFFG"
    assert render_board(ROWS, 6) == "SFFF\nFHPH\nFFFH\nHFFG"
    assert strip_ansi("\x1b[41mS\x1b[0mFF") == "SFF"


def test_moves_and_goal_reward() -> None:
    env = FrozenLakeEnv()
    messages = env.reset(LAKE)
    assert messages[1] == {"role": "user", "content": "PFFF\nFHFH\nFFFH\nHFFG"}
    step = env.step("<answer>down</answer>")
    assert step.observation == {"role": "user", "content": "SFFF\nPHFH\nFFFH\nHFFG"}
    assert (step.reward, step.done, step.info["position"]) == (0.0, False, 4)
    assert step.info["state_key"] == f"{LAKE.task_id}:4"
    for move in ["down", "RIGHT", "down", " right\n"]:
        assert not env.step(move).done
    final = env.step("<answer>right</answer>")
    assert (final.observation, final.reward, final.done) == (None, 1.0, True)
    assert final.info["correct"] is True and final.info["truncated"] is False


def test_hole_ends_episode_without_reward() -> None:
    env = FrozenLakeEnv(turn_cost=0.5)
    env.reset(LAKE)
    step = env.step("<answer>right</answer>")
    assert step.reward == -0.5
    hole = env.step("<answer>down</answer>")
    assert (hole.observation, hole.reward, hole.done) == (None, -0.5, True)
    assert hole.info["correct"] is False and hole.info["position"] == 5


@pytest.mark.parametrize(
    ("response", "reason_part"),
    [
        ("jump", "no <call> or <answer> found"),
        ("<answer>north</answer>", "unknown move 'north'"),
        ("<answer>left", "unclosed <answer>"),
        ("<call>left</call>", "no tool name"),
    ],
)
def test_malformed_move_does_not_move(response: str, reason_part: str) -> None:
    env = FrozenLakeEnv()
    env.reset(LAKE)
    step = env.step(response)
    assert step.info["malformed"] is True and reason_part in step.info["error"]
    assert step.info["position"] == 0 and not step.done
    assert step.observation is not None
    assert step.observation["content"].startswith("Invalid: ")
    assert step.observation["content"].endswith("PFFF\nFHFH\nFFFH\nHFFG")
    # the pure check gives the same reason, with no episode
    assert reason_part in FrozenLakeEnv().check_response(LAKE, response)
    assert FrozenLakeEnv().check_response(LAKE, "<answer>left</answer>") is None


def test_max_turns_truncates() -> None:
    env = FrozenLakeEnv(max_turns=2)
    env.reset(LAKE)
    assert not env.step("left").done  # bumping into the wall: stays put
    last = env.step("up")
    assert last.done and last.info["truncated"] and last.reward == 0.0
    assert last.info["correct"] is False


def test_default_max_turns_is_board_area() -> None:
    env = FrozenLakeEnv()
    env.reset(LAKE)
    results = [env.step("left") for _ in range(16)]
    assert [r.done for r in results] == [False] * 15 + [True]
    assert results[-1].info["truncated"]


def test_snapshot_restore_round_trip_slippery() -> None:
    env = FrozenLakeEnv(is_slippery=True, max_turns=50)
    env.reset(LAKE)
    env.step("right")
    snap = env.snapshot()
    key = env.state_key()
    moves = ["right", "down", "right", "down", "down", "right", "up", "left"]
    first = []
    for move in moves:
        result = env.step(move)
        first.append(result)
        if result.done:
            break
    env.restore(snap)
    assert env.state_key() == key
    again = []
    for move in moves[: len(first)]:
        again.append(env.step(move))
    assert again == first
    with pytest.raises(TypeError):
        env.restore(None)


def test_slippery_differs_from_deterministic_somewhere() -> None:
    positions = set()
    for seed in range(20):
        env = FrozenLakeEnv(is_slippery=True, seed=seed)
        env.reset(LAKE)
        positions.add(env.step("right").info["position"])
    assert len(positions) > 1


def test_task_generation() -> None:
    tasks = frozenlake_tasks(8, seed=5)
    assert tasks == frozenlake_tasks(8, seed=5)
    assert tasks != frozenlake_tasks(8, seed=6)
    assert len({t.task_id for t in tasks}) == 8
    for task in tasks:
        rows = task.payload["map"]
        assert len(rows) == 4 and all(len(r) == 4 for r in rows)
        assert rows[0][0] == "S" and rows[-1][-1] == "G"
        assert task.task_id == map_id(rows)


def test_shortest_path() -> None:
    # BFS tries left, down, right, up in that order, so ties go to "down" first.
    assert shortest_path(ROWS) == ["down", "down", "right", "down", "right", "right"]
    with pytest.raises(ValueError, match="no path"):
        shortest_path(("SH", "HG"))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([3, 4, 5]))
def test_bfs_demonstrations_reach_goal_without_ansi(seed: int, size: int) -> None:
    (task,) = frozenlake_tasks(1, seed=seed, size=size)
    messages = demonstration(task)
    assert messages[0]["role"] == "system"
    assert all("\x1b" not in m["content"] for m in messages)
    moves = [m["content"] for m in messages if m["role"] == "assistant"]
    assert len(moves) == len(shortest_path(task.payload["map"]))
    env = FrozenLakeEnv()
    env.reset(task)
    results = [env.step(move) for move in moves]
    assert results[-1].done and results[-1].reward == 1.0
    assert not any(r.done for r in results[:-1])


def test_registry_builds_frozenlake() -> None:
    env = envs.make_env("frozenlake", is_slippery=False, max_turns=5)
    assert isinstance(env, FrozenLakeEnv)
    (task,) = envs.make_tasks("frozenlake", 1, seed=0, size=3)
    assert envs.demonstration("frozenlake", task)[-1]["role"] == "assistant"


def test_restore_after_reset_to_another_map() -> None:
    other = frozenlake_tasks(1, seed=1)[0]
    env = FrozenLakeEnv(is_slippery=True)
    env.reset(LAKE)
    snap = env.snapshot()
    expected = env.step("right")
    env.reset(other)
    env.step("down")
    env.restore(snap)
    assert env.step("right") == expected
