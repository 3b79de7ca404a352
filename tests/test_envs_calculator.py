"""CalculatorEnv, its task generator and demonstrations; the env registry."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import turnrl.envs as envs
from turnrl.envs.calculator import (
    CalculatorEnv,
    calculator_tasks,
    demonstration,
    is_correct,
    make_chain_task,
    make_task,
    parse_number,
)
from turnrl.types import Env

HARD = make_task(347, "*", 812, tags=("hard",))
EASY = make_task(3, "+", 4, tags=("easy",))


def test_make_task() -> None:
    assert HARD.task_id == "calc-347*812"
    assert HARD.payload == {
        "question": "Compute 347*812.",
        "expression": "347*812",
        "answer": "281764",
    }
    word = make_task(3, "+", 4, template=0)
    assert word.task_id == "calc-w0-3+4"
    assert word.payload["question"] == "Ann has 3 pens and buys 4. How many now?"


def test_tool_then_correct_answer() -> None:
    env = CalculatorEnv()
    messages = env.reset(HARD)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"] == "Compute 347*812."
    step = env.step("<call>347*812</call>")
    assert step.observation == {"role": "tool", "content": "281764"}
    assert (step.reward, step.done) == (0.0, False)
    assert step.info["tool_call"] and not step.info["malformed"] and step.info["correct"] is None
    final = env.step("<answer>281764</answer>")
    assert (final.observation, final.reward, final.done) == (None, 1.0, True)
    assert final.info["correct"] is True and final.info["answered"] is True
    assert final.info["turn"] == 1


def test_wrong_answer_and_turn_cost() -> None:
    env = CalculatorEnv(turn_cost=0.1)
    env.reset(HARD)
    assert env.step("<call>1+1</call>").reward == pytest.approx(-0.1)
    final = env.step("<answer>280000</answer>")
    assert final.reward == pytest.approx(-0.1)
    assert final.info["correct"] is False
    env.reset(EASY)
    assert env.step("<answer>7</answer>").reward == pytest.approx(0.9)


def test_malformed_response_is_an_observation() -> None:
    env = CalculatorEnv()
    env.reset(EASY)
    step = env.step("<call>3+4")
    assert step.info["malformed"] is True and step.info["tool_call"] is False
    assert step.info["error"] == "unclosed <call> tag"
    assert step.observation == {"role": "user", "content": "Invalid: unclosed <call> tag."}
    assert not step.done


def test_tool_error_is_an_observation() -> None:
    env = CalculatorEnv()
    env.reset(EASY)
    step = env.step("<call>__import__('os')</call>")
    assert step.observation == {"role": "tool", "content": "error: unsupported syntax: Call"}
    assert step.info["error"] == "unsupported syntax: Call" and step.info["tool_call"]


def test_max_turns_truncates_with_zero_reward() -> None:
    env = CalculatorEnv(max_turns=2, turn_cost=0.25)
    env.reset(EASY)
    first = env.step("<call>3+4</call>")
    assert not first.done
    last = env.step("<call>3+4</call>")
    assert (last.observation, last.reward, last.done) == (None, -0.25, True)
    assert last.info["truncated"] is True and last.info["correct"] is False
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("<answer>7</answer>")


def test_step_before_reset_raises() -> None:
    with pytest.raises(RuntimeError, match="reset"):
        CalculatorEnv().step("<answer>1</answer>")


def test_answer_parsing() -> None:
    assert parse_number("281,764") == 281764
    assert parse_number("347*812 = 281764") == 281764
    assert parse_number("-3.5") == -3.5
    assert parse_number("no idea") is None
    assert is_correct("3.5", 3.5) and not is_correct("3.6", 3.5) and not is_correct("x", 1)


def test_state_key_tracks_observations() -> None:
    env = CalculatorEnv()
    env.reset(EASY)
    start = env.state_key()
    key_a = env.step("<call>3+4</call>").info["state_key"]
    env.reset(EASY)
    assert env.state_key() == start
    key_b = env.step("<call>3 + 4</call>").info["state_key"]
    assert key_a == key_b  # same tool result -> same anchor state
    env.reset(HARD)
    assert env.state_key() != start


def test_snapshot_restore_round_trip() -> None:
    env = CalculatorEnv(max_turns=3)
    env.reset(HARD)
    env.step("<call>347*812</call>")
    snap = env.snapshot()
    key = env.state_key()
    first = env.step("<call>1+1</call>")
    last = env.step("<call>2+2</call>")
    assert last.done
    env.restore(snap)
    assert env.state_key() == key
    assert env.step("<call>1+1</call>") == first
    env.restore(snap)  # the snapshot stays reusable and independent
    assert env.step("<answer>281764</answer>").reward == 1.0
    with pytest.raises(TypeError):
        env.restore({"not": "a snapshot"})


def test_hermes_format_env() -> None:
    env = CalculatorEnv(fmt="hermes")
    messages = env.reset(HARD)
    assert "<tool_call>" in messages[0]["content"]
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "347*812"}}</tool_call>'
    assert env.step(call).observation == {"role": "tool", "content": "281764"}


def test_task_generation_is_deterministic_and_mixed() -> None:
    tasks = calculator_tasks(40, seed=7, hard_fraction=0.25)
    assert tasks == calculator_tasks(40, seed=7, hard_fraction=0.25)
    assert tasks != calculator_tasks(40, seed=8, hard_fraction=0.25)
    assert sum(t.tags == ("hard",) for t in tasks) == 10
    assert len({t.task_id for t in tasks}) == 40
    for task in tasks:
        a, b = (
            task.payload["expression"].replace("+", " ").replace("-", " ").replace("*", " ").split()
        )
        if task.tags == ("hard",):
            assert "*" in task.task_id and len(a) == len(b) == 3
        else:
            assert len(a) == len(b) == 1 and int(task.payload["answer"]) >= 0
        assert len(task.payload["question"]) <= 50


def test_word_problems_and_repeats_when_pool_exhausted() -> None:
    words = calculator_tasks(10, seed=0, word_fraction=1.0)
    assert all(t.task_id.startswith("calc-w0-") for t in words)
    many = calculator_tasks(400, seed=0, hard_fraction=0.0)
    assert len(many) == 400 and len({t.task_id for t in many}) < 400
    with pytest.raises(ValueError, match="hard_fraction=2"):
        calculator_tasks(3, seed=0, hard_fraction=2)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.booleans())
def test_demonstrations_are_correct(seed: int, use_tool: bool) -> None:
    (task,) = calculator_tasks(1, seed=seed)
    messages = demonstration(task, use_tool=use_tool)
    roles = [m["role"] for m in messages]
    if use_tool:
        assert roles == ["system", "user", "assistant", "tool", "assistant"]
        assert messages[3]["content"] == task.payload["answer"]
    else:
        assert roles == ["system", "user", "assistant"]
    assert messages[-1]["content"] == f"<answer>{task.payload['answer']}</answer>"


def test_hermes_demonstration() -> None:
    messages = demonstration(HARD, use_tool=True, fmt="hermes")
    assert messages[2]["content"] == (
        '<tool_call>{"name": "calculator", "arguments": {"expression": "347*812"}}</tool_call>'
    )


def test_registry() -> None:
    env = envs.make_env("calculator", max_turns=2)
    assert isinstance(env, CalculatorEnv) and isinstance(env, Env) and env.max_turns == 2
    assert envs.make_tasks("calculator", 3, seed=1) == calculator_tasks(3, 1)
    assert (
        envs.demonstration("calculator", EASY, use_tool=False)[-1]["content"]
        == "<answer>7</answer>"
    )
    assert {"calculator", "frozenlake"} <= set(envs.ENVS)
    with pytest.raises(ValueError, match="known: \\['calculator', 'frozenlake'"):
        envs.make_env("chess")
    with pytest.raises(ValueError, match="already registered"):
        envs.register_env("calculator", envs.ENVS["calculator"])


def test_import_is_light() -> None:
    import subprocess
    import sys

    code = "import sys, turnrl.envs; print('torch' in sys.modules, 'gymnasium' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_step_truncated_parses_by_default_and_ends_the_episode_with_zero_reward() -> None:
    env = CalculatorEnv(turn_cost=0.1)
    env.reset(EASY)
    parsed = env.step_truncated("<call>3+4")  # default "parse": a malformed retry turn
    assert parsed.info["malformed"] is True and not parsed.done
    assert parsed.reward == pytest.approx(-0.1)
    env = CalculatorEnv(turn_cost=0.1, truncation="zero_reward")
    env.reset(EASY)
    assert not env.step("<call>3+4</call>").done  # complete responses are stepped as usual
    cut = env.step_truncated("<answer>7</answer")  # even a cut right answer is worth 0
    assert (cut.observation, cut.done) == (None, True)
    assert cut.reward == pytest.approx(-0.1)
    assert cut.info["correct"] is False and cut.info["truncated"] is True
    assert cut.info["response_truncated"] is True and cut.info["turn"] == 1
    assert cut.info["state_key"] == env.state_key()
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("<answer>7</answer>")
    with pytest.raises(ValueError, match="truncation must be one of parse, zero_reward"):
        CalculatorEnv(truncation="drop")


def test_chain_task_and_its_step_by_step_demonstration() -> None:
    task = make_chain_task(7, [("+", 2), ("-", 4)], tags=("medium",))
    assert task.task_id == "calc-7+2-4"
    assert task.payload == {
        "question": "Compute 7+2-4.",
        "expression": "7+2-4",
        "answer": "5",
        "tool_steps": ["7+2", "9-4"],
    }
    messages = demonstration(task, use_tool=True, max_turns=6)
    assert [m["content"] for m in messages[2:]] == [
        "<call>7+2</call>",
        "9",
        "<call>9-4</call>",
        "5",
        "<answer>5</answer>",
    ]
    assert [m["content"] for m in demonstration(task, use_tool=False)[2:]] == ["<answer>5</answer>"]
    with pytest.raises(ValueError, match="chain operators"):
        make_chain_task(2, [("*", 3)])


def test_medium_tasks_are_additive_and_stay_single_digit() -> None:
    # the default mix (no medium tasks) is exactly what it was
    assert calculator_tasks(40, seed=7, hard_fraction=0.25, medium_fraction=0.0) == (
        calculator_tasks(40, seed=7, hard_fraction=0.25)
    )
    tasks = calculator_tasks(200, seed=1, hard_fraction=0.2, medium_fraction=0.5)
    assert tasks == calculator_tasks(200, seed=1, hard_fraction=0.2, medium_fraction=0.5)
    kinds = [t.tags[0] for t in tasks]
    assert (kinds.count("hard"), kinds.count("medium"), kinds.count("easy")) == (40, 100, 60)
    calls = set()
    for task in (t for t in tasks if t.tags == ("medium",)):
        steps = task.payload["tool_steps"]
        calls.add(len(steps))
        value = int(steps[0].replace("-", "+").split("+")[0])
        for step in steps:  # each step starts from the previous result, stays in [0, 9]
            a, op, b = int(step[0]), step[1], int(step[2:])
            assert a == value and op in "+-" and 1 <= b <= 9
            value = a + b if op == "+" else a - b
            assert 0 <= value <= 9
        assert task.payload["answer"] == str(value)
        assert demonstration(task, use_tool=True, max_turns=6)[-1]["content"] == (
            f"<answer>{value}</answer>"
        )
    assert calls == {1, 2, 3}
    only_two = calculator_tasks(30, seed=2, hard_fraction=0.0, medium_fraction=1.0,
                                medium_operations=(2, 2))  # fmt: skip
    assert {len(t.payload["tool_steps"]) for t in only_two} == {2}
    small = calculator_tasks(
        60, seed=3, hard_fraction=0.0, medium_fraction=1.0, medium_max=4, medium_stepwise=False
    )
    for task in small:
        numbers = task.payload["expression"].replace("-", "+").split("+")
        assert all(0 <= int(x) <= 4 for x in numbers) and 0 <= int(task.payload["answer"]) <= 4
        assert task.payload["tool_steps"] == [task.payload["expression"]]
        assert [m["content"] for m in demonstration(task, use_tool=True)[2:]] == [
            f"<call>{task.payload['expression']}</call>",
            task.payload["answer"],
            f"<answer>{task.payload['answer']}</answer>",
        ]
    with pytest.raises(ValueError, match="medium_max=10"):
        calculator_tasks(10, seed=0, medium_fraction=0.5, medium_max=10)
    with pytest.raises(ValueError, match=r"medium_fraction=0\.8"):
        calculator_tasks(10, seed=0, hard_fraction=0.5, medium_fraction=0.8)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.integers(100, 990), st.integers(0, 9))
def test_hard_operands_bound_every_hard_factor(seed: int, low: int, width: int) -> None:
    tasks = calculator_tasks(40, seed, hard_fraction=0.5, hard_operands=[low, low + width])
    hard = [t for t in tasks if "hard" in t.tags]
    assert len(hard) == 20
    for task in hard:
        a, b = (int(x) for x in task.payload["expression"].split("*"))
        assert low <= a <= low + width and low <= b <= low + width
    # the default range is the hard_digits one, drawn exactly as before the option existed
    assert calculator_tasks(40, seed, hard_fraction=0.5, hard_operands=[100, 999]) == (
        calculator_tasks(40, seed, hard_fraction=0.5)
    )


def test_demo_recipe_products_all_have_six_digits() -> None:
    tasks = calculator_tasks(512, 0, hard_fraction=1.0, hard_operands=(317, 999))
    assert {len(str(int(t.payload["answer"]))) for t in tasks} == {6}
    with pytest.raises(ValueError, match="hard_operands"):
        calculator_tasks(4, 0, hard_operands=(999, 317))
