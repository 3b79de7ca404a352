"""Arithmetic with a calculator tool: the smallest env where calling a tool pays.

Easy tasks (single-digit ``+``/``-``) are answerable directly; hard tasks
(3-digit ``*``) are hopeless to guess, so the agent should call the calculator.
A policy that stops calling tools shows up as a drop in accuracy on the "hard"
tag while "easy" stays flat. Medium tasks (``medium_fraction``, none by default)
sit in between: a chain of 2 to 4 operands whose running value stays in a small
range (``Compute 7+2-4.``), which a small model can often answer directly, and
whose demonstrated tool path makes one call per operation (1-3 calls,
``payload["tool_steps"]``) or one call on the whole expression, so using the
tool is reliable but costs turns.

Episode: ``reset`` gives ``[system, user]``; each response is one action (see
:mod:`turnrl.envs.tools`). A tool call returns a ``"tool"`` message with the
result; a malformed response returns a ``"user"`` message saying what was wrong;
a final answer ends the episode with reward 1 if numerically correct, else 0.
``turn_cost`` is subtracted on every turn; after ``max_turns`` turns without an
answer the episode ends with reward ``-turn_cost`` and ``info["truncated"]``.

A response cut at the token limit (the runner calls :meth:`CalculatorEnv.step_truncated`)
is parsed like any other by default (``truncation="parse"``: usually malformed, so
the agent gets another turn). ``truncation="zero_reward"`` ends the episode there
instead, as a wrong final answer (reward ``-turn_cost``, ``info["correct"]`` False,
``info["truncated"]`` and ``info["response_truncated"]`` True): what verl does with
a response cut at ``max_response_length``, whose reward is computed on the cut text.

``info`` per step: ``tool_call``, ``malformed``, ``error`` (str or None),
``answered``, ``correct`` (None before the last turn; on the last turn a bool,
False when truncated), ``truncated``, ``turn`` and ``state_key`` (hash of the
task and the observations so far: equal keys mean equal decision points).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from turnrl.envs.safe_math import calculate, format_number
from turnrl.envs.tool_question import ToolQuestionEnv
from turnrl.envs.tools import (
    FinalAnswer,
    Malformed,
    Tool,
    ToolCall,
    ToolRegistry,
    format_answer,
)
from turnrl.types import Message, StepResult, Task

CALCULATOR = Tool(
    name="calculator",
    description="evaluates + - * / // % ** ( )",
    fn=calculate,
    timeout_s=2.0,
    parameter="expression",
)
"""The calculator tool (safe arithmetic, never ``eval``)."""

TRUNCATION_RULES = ("parse", "zero_reward")
"""What a response cut at the token limit means (see the module docstring)."""

TAGS_SYSTEM_PROMPT = "Tool: <call>expr</call>. Reply <answer>n</answer>."
"""Kept short on purpose: a ~0.1M-parameter character model reads it every episode."""

_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")


def parse_number(text: str) -> float | None:
    """The number an answer states: the whole text if numeric, else its last number.

    Thousands separators are ignored (``"281,764"``); None if there is no number.
    """
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    try:
        return float(matches[-1].replace(",", ""))
    except ValueError:
        return None


def is_correct(answer: str, expected: float) -> bool:
    """Whether ``answer`` states ``expected`` (relative tolerance 1e-6)."""
    value = parse_number(answer)
    return value is not None and abs(value - expected) <= 1e-6 * max(1.0, abs(expected))


# ----------------------------------------------------------------------------- tasks

WORD_TEMPLATES: dict[str, tuple[str, ...]] = {
    "+": ("Ann has {a} pens and buys {b}. How many now?",),
    "-": ("Ann has {a} pens and loses {b}. How many now?",),
    "*": ("{a} boxes hold {b} pens each. How many pens?",),
}
"""Short word-problem templates, one per operator, indexed by ``w0``, ``w1``... in task ids."""


def make_task(a: int, op: str, b: int, *, tags: tuple[str, ...] = (), template: int = -1) -> Task:
    """The task "a op b"; ``template >= 0`` phrases it with ``WORD_TEMPLATES[op][template]``."""
    expression = f"{a}{op}{b}"
    answer = calculate(expression)
    if template >= 0:
        question = WORD_TEMPLATES[op][template].format(a=a, b=b)
        task_id = f"calc-w{template}-{expression}"
    else:
        question = f"Compute {expression}."
        task_id = f"calc-{expression}"
    payload = {"question": question, "expression": expression, "answer": answer}
    return Task(task_id=task_id, payload=payload, tags=tags)


def make_chain_task(
    first: int,
    steps: Sequence[tuple[str, int]],
    *,
    tags: tuple[str, ...] = (),
    stepwise: bool = True,
) -> Task:
    """The task ``first op1 b1 op2 b2 ...`` (``+``/``-``), evaluated left to right.

    ``payload["tool_steps"]`` is the tool path its demonstration takes: with
    ``stepwise``, one call per operation, each on the previous result (``7+2``,
    ``9-4``); without, one call on the whole expression.
    """
    expression = f"{first}" + "".join(f"{op}{b}" for op, b in steps)
    value, tool_steps = first, []
    for op, b in steps:
        if op not in "+-":
            raise ValueError(f"chain operators are + and -; got {op!r}")
        tool_steps.append(f"{value}{op}{b}")
        value = value + b if op == "+" else value - b
    payload = {
        "question": f"Compute {expression}.",
        "expression": expression,
        "answer": calculate(expression),
        "tool_steps": tool_steps if stepwise else [expression],
    }
    return Task(task_id=f"calc-{expression}", payload=payload, tags=tags)


def _medium_task(
    rng: random.Random, operations: tuple[int, int], largest: int, stepwise: bool
) -> Task:
    """A random chain of ``operations`` (drawn in the closed range) steps whose running
    value stays in ``[0, largest]``; no step adds or subtracts 0."""
    value = rng.randint(0, largest)
    first, steps = value, []
    for _ in range(rng.randint(*operations)):
        if value == 0:
            op = "+"
        elif value == largest:
            op = "-"
        else:
            op = rng.choice("+-")
        b = rng.randint(1, largest - value if op == "+" else value)
        value = value + b if op == "+" else value - b
        steps.append((op, b))
    return make_chain_task(first, steps, tags=("medium",), stepwise=stepwise)


def calculator_tasks(
    n: int,
    seed: int,
    hard_fraction: float = 0.5,
    *,
    word_fraction: float = 0.0,
    easy_max: int = 9,
    hard_digits: int = 3,
    hard_operands: tuple[int, int] | list[int] | None = None,
    medium_fraction: float = 0.0,
    medium_operations: tuple[int, int] | list[int] = (1, 3),
    medium_max: int = 9,
    medium_stepwise: bool = True,
) -> list[Task]:
    """``n`` tasks, deterministic from ``seed``: exactly ``round(n * hard_fraction)`` hard
    and ``round(n * medium_fraction)`` medium, the rest easy.

    Easy: ``a + b`` or ``a - b`` (a >= b) with operands in ``[0, easy_max]``.
    Hard: ``a * b`` with ``hard_digits``-digit operands, or operands drawn from the
    closed range ``hard_operands`` (e.g. ``(317, 999)``: 3-digit operands whose
    product always has 6 digits). Medium: a chain of
    ``medium_operations`` (a closed range, default 1 to 3) ``+``/``-`` steps whose
    running value stays in ``[0, medium_max]`` (single digits by default), with a
    step-by-step tool path (``medium_stepwise``) or one call on the whole expression
    (see :func:`make_chain_task`). A
    ``word_fraction`` of easy and hard tasks use a short word-problem template.
    Problems are distinct while the pools allow (the easy pool is small); after
    that, repeats are allowed. With ``medium_fraction = 0`` (the default) the tasks
    are exactly those drawn before medium tasks existed.
    """
    low_ops, high_ops = medium_operations
    if (
        n < 0
        or not 0.0 <= hard_fraction <= 1.0
        or not 0.0 <= word_fraction <= 1.0
        or not 0.0 <= medium_fraction <= 1.0 - hard_fraction + 1e-12
        or not 1 <= low_ops <= high_ops
        or not 1 <= medium_max <= 9
        or (hard_operands is not None and not 1 <= hard_operands[0] <= hard_operands[1])
    ):
        raise ValueError(
            f"need n >= 0, fractions in [0, 1] with hard + medium <= 1 and "
            f"1 <= medium_operations[0] <= medium_operations[1], 1 <= medium_max <= 9, "
            f"1 <= hard_operands[0] <= hard_operands[1]; "
            f"got n={n}, hard_fraction={hard_fraction}, medium_fraction={medium_fraction}, "
            f"word_fraction={word_fraction}, medium_operations={tuple(medium_operations)}, "
            f"medium_max={medium_max}, hard_operands={hard_operands}"
        )
    rng = random.Random(seed)
    n_hard = round(n * hard_fraction)
    n_medium = min(round(n * medium_fraction), n - n_hard)
    kinds = ["hard"] * n_hard + ["medium"] * n_medium + ["easy"] * (n - n_hard - n_medium)
    rng.shuffle(kinds)
    low, high = hard_operands or (10 ** (hard_digits - 1), 10**hard_digits - 1)
    tasks: list[Task] = []
    seen: set[str] = set()
    for kind in kinds:
        for _attempt in range(50):
            if kind == "medium":
                task = _medium_task(rng, (low_ops, high_ops), medium_max, medium_stepwise)
                if task.task_id not in seen:
                    break
                continue
            if kind == "hard":
                a, op, b = rng.randint(low, high), "*", rng.randint(low, high)
            else:
                a, op, b = rng.randint(0, easy_max), rng.choice("+-"), rng.randint(0, easy_max)
                if op == "-" and a < b:
                    a, b = b, a
            word = rng.random() < word_fraction
            template = rng.randrange(len(WORD_TEMPLATES[op])) if word else -1
            task = make_task(a, op, b, tags=(kind,), template=template)
            if task.task_id not in seen:
                break
        seen.add(task.task_id)
        tasks.append(task)
    return tasks


# ----------------------------------------------------------------------------- env


@dataclass(frozen=True)
class _State:
    """Everything that changes during an episode (immutable, so snapshots are free)."""

    task: Task
    turn: int = 0
    observations: tuple[str, ...] = ()
    done: bool = False


class CalculatorEnv(ToolQuestionEnv):
    """Answer an arithmetic question, optionally with the calculator tool."""

    state_type = _State

    def __init__(
        self,
        *,
        fmt: str = "tags",
        max_turns: int = 4,
        turn_cost: float = 0.0,
        tools: Sequence[Tool] = (CALCULATOR,),
        default_tool: str | None = "calculator",
        system_prompt: str | None = None,
        truncation: Literal["parse", "zero_reward"] = "parse",
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if truncation not in TRUNCATION_RULES:
            raise ValueError(
                f"truncation must be one of {', '.join(TRUNCATION_RULES)}; got {truncation!r}"
            )
        self.truncation = truncation
        tags_default = fmt == "tags" and default_tool == "calculator" and len(tools) == 1
        self._init_tools(
            fmt=fmt,
            max_turns=max_turns,
            turn_cost=turn_cost,
            registry=ToolRegistry(tools, default=default_tool),
            system_prompt=system_prompt,
            tags_prompt=TAGS_SYSTEM_PROMPT if tags_default else None,
        )

    # -- Env API (reset and check_response: ToolQuestionEnv) -------------------

    def step(self, response: str) -> StepResult:
        state = self._require_state()
        turn = state.turn + 1
        reward = 0.0 - self.turn_cost  # 0.0 - x avoids a -0.0 reward
        action = self.registry.parse(response, self.fmt)
        info: dict[str, Any] = {
            "turn": state.turn,
            "tool_call": isinstance(action, ToolCall),
            "malformed": isinstance(action, Malformed),
            "error": None,
            "answered": isinstance(action, FinalAnswer),
            "correct": None,
            "truncated": False,
        }
        if isinstance(action, FinalAnswer):
            correct = is_correct(action.text, float(state.task.payload["answer"]))
            info["correct"] = correct
            self._state = replace(state, turn=turn, done=True)
            info["state_key"] = self.state_key()
            return StepResult(None, reward + float(correct), True, info)

        if isinstance(action, ToolCall):
            result = self.registry.execute(action)
            info["error"] = result.error
            observation: Message = {"role": "tool", "content": result.output}
        else:
            info["error"] = action.reason
            observation = {"role": "user", "content": f"Invalid: {action.reason}."}

        done = turn >= self.max_turns
        self._state = replace(
            state,
            turn=turn,
            observations=(*state.observations, observation["content"]),
            done=done,
        )
        info["state_key"] = self.state_key()
        if done:
            info.update(truncated=True, correct=False)
            return StepResult(None, reward, True, info)
        return StepResult(observation, reward, False, info)

    def step_truncated(self, response: str) -> StepResult:
        """A response cut at the token limit: parsed as usual, or (``truncation =
        "zero_reward"``) the end of the episode with no success reward."""
        if self.truncation == "parse":
            return self.step(response)
        state = self._require_state()
        self._state = replace(state, turn=state.turn + 1, done=True)
        info: dict[str, Any] = {
            "turn": state.turn,
            "tool_call": False,
            "malformed": False,
            "error": "response cut at the token limit",
            "answered": False,
            "correct": False,
            "truncated": True,
            "response_truncated": True,
            "state_key": self.state_key(),
        }
        return StepResult(None, 0.0 - self.turn_cost, True, info)

    def reference_response(self, task: Task) -> str | None:
        return format_answer(_answer_text(task.payload["answer"]))

    def state_key(self) -> str | None:
        if self._state is None:
            return None
        text = "\x1f".join((self._state.task.task_id, *self._state.observations))
        return hashlib.sha1(text.encode()).hexdigest()[:16]


def demonstration(task: Task, use_tool: bool = True, **env_kwargs: Any) -> list[Message]:
    """The full conversation of an ideal solution, for supervised warm start.

    With ``use_tool`` the agent calls the calculator (once on the whole expression,
    or once per step of ``payload["tool_steps"]`` for medium chains), then answers
    with its result; without, it answers the correct number directly (even on hard
    tasks). The observations are produced by stepping a real :class:`CalculatorEnv`,
    so they are exactly what the environment would return.
    """
    env = CalculatorEnv(**env_kwargs)
    messages = env.reset(task)
    answer = format_answer(_answer_text(task.payload["answer"]))
    if use_tool:
        name = env.registry.default or env.registry.names[0]
        for expression in task.payload.get("tool_steps", [task.payload["expression"]]):
            call = env.registry.format_call(env.fmt, name, expression)
            messages.append({"role": "assistant", "content": call})
            result = env.step(call)
            if result.observation is None:
                raise RuntimeError(f"tool call ended the episode early (max_turns={env.max_turns})")
            messages.append(result.observation)
    messages.append({"role": "assistant", "content": answer})
    final = env.step(answer)
    if not final.info["correct"]:
        raise RuntimeError(f"demonstration answer {answer!r} judged incorrect for {task.task_id}")
    return messages


def demo_options(
    task: Task, rng: random.Random, tool_fraction: float, easy_tool_fraction: float
) -> dict[str, Any]:
    """Whether the warm start's demonstration of ``task`` calls the tool: with probability
    ``tool_fraction`` on hard and medium tasks, ``easy_tool_fraction`` on the others."""
    return {"use_tool": rng.random() < _tool_probability(task, tool_fraction, easy_tool_fraction)}


def demo_variants(
    task: Task, tool_fraction: float, easy_tool_fraction: float
) -> list[tuple[float, dict[str, Any]]]:
    """The two demonstrations :func:`demo_options` chooses between, with their
    probabilities (a variant of probability 0 is left out)."""
    p_tool = _tool_probability(task, tool_fraction, easy_tool_fraction)
    variants = [(p_tool, {"use_tool": True}), (1.0 - p_tool, {"use_tool": False})]
    return [(p, kwargs) for p, kwargs in variants if p > 0.0]


def _tool_probability(task: Task, tool_fraction: float, easy_tool_fraction: float) -> float:
    """``tool_fraction`` for hard and medium tasks, ``easy_tool_fraction`` for the rest."""
    needs_tool = "hard" in task.tags or "medium" in task.tags
    return tool_fraction if needs_tool else easy_tool_fraction


def _answer_text(value: str | float) -> str:
    """The canonical text of a stored answer (generated tasks store it formatted)."""
    return value if isinstance(value, str) else format_number(value)
