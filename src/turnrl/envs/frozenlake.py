"""FrozenLake as a multi-turn text environment (maps and transitions from gymnasium).

Each turn the agent sees the board as plain text (``P`` marks its position,
``S`` start, ``F`` ice, ``H`` hole, ``G`` goal) and replies with one move,
``<answer>left</answer>`` or just ``left`` (left/down/right/up). An unparsable
reply is a malformed turn: the agent is told why and does not move. Reward 1 on
reaching the goal; the episode ends in a hole, at the goal, or after
``max_turns`` turns (``info["truncated"]``). ``turn_cost`` is subtracted per turn.

Random maps come from gymnasium's ``generate_random_map(size, p, seed)`` and moves
from gymnasium's ``FrozenLakeEnv.step`` (so ``is_slippery`` behaves as in
gymnasium). gymnasium is imported lazily, so ``import turnrl.envs`` stays light.
The board is rendered here from the map and position, not with gymnasium's ANSI
renderer, so observations never contain terminal escape codes.

Departure from gymnasium: the episode state (position, turn, RNG state) lives in
an immutable snapshot owned by this class and is pushed into the gymnasium env
before each move, so ``snapshot``/``restore`` round-trip exactly, including the
slippery-ice random stream.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import deque
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from turnrl.envs.episode_state import ImmutableStateEnv
from turnrl.envs.tools import FinalAnswer, Malformed, format_answer, parse_response
from turnrl.types import Message, StepResult, Task

MOVES: dict[str, int] = {"left": 0, "down": 1, "right": 2, "up": 3}
"""Move words and gymnasium's action ids for them."""

SYSTEM_PROMPT = "Reach G, avoid H. P is you. Reply <answer>left|down|right|up</answer>."
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def strip_ansi(text: str) -> str:
    """Remove ANSI terminal escape sequences (for any board rendered by gymnasium)."""
    return _ANSI.sub("", text)


def render_board(rows: tuple[str, ...], position: int) -> str:
    """The map as text with ``P`` at ``position`` (row-major cell index)."""
    size = len(rows[0])
    r, c = divmod(position, size)
    cells = [list(row) for row in rows]
    cells[r][c] = "P"
    return "\n".join("".join(row) for row in cells)


def map_id(rows: tuple[str, ...]) -> str:
    """A short deterministic id of a map."""
    return f"lake{len(rows)}-" + hashlib.sha1("/".join(rows).encode()).hexdigest()[:10]


def frozenlake_tasks(n: int, seed: int, size: int = 4, p: float = 0.8) -> list[Task]:
    """``n`` distinct random maps (while possible), deterministic from ``seed``.

    ``p`` is the probability that a cell is frozen (gymnasium's parameter).
    gymnasium guarantees every generated map has a path from S to G.
    """
    from gymnasium.envs.toy_text.frozen_lake import generate_random_map

    if n < 0 or size < 2:
        raise ValueError(f"need n >= 0 and size >= 2; got n={n}, size={size}")
    rng = random.Random(seed)
    tasks: list[Task] = []
    seen: set[str] = set()
    for _ in range(n):
        for _attempt in range(50):
            map_seed = rng.randrange(2**31)
            rows = tuple(generate_random_map(size=size, p=p, seed=map_seed))
            if map_id(rows) not in seen:
                break
        seen.add(map_id(rows))
        payload = {"map": rows, "size": size, "seed": map_seed}
        tasks.append(Task(task_id=map_id(rows), payload=payload, tags=(f"size{size}",)))
    return tasks


def _gym_lake(rows: tuple[str, ...], is_slippery: bool) -> Any:
    """A fresh gymnasium FrozenLake env for one map."""
    from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake

    return GymFrozenLake(desc=list(rows), is_slippery=is_slippery)


@lru_cache(maxsize=256)
def _deterministic_transitions(rows: tuple[str, ...]) -> dict[int, dict[int, list[tuple]]]:
    """gymnasium's transition table ``P[state][action]`` of a map on non-slippery ice
    (cached; only read)."""
    return _gym_lake(rows, False).P


def shortest_path(rows: tuple[str, ...]) -> list[str]:
    """Moves of a shortest path from S to G on non-slippery ice (BFS), avoiding holes."""
    transitions = _deterministic_transitions(tuple(rows))
    flat = "".join(rows)
    start, goal = flat.index("S"), flat.index("G")
    parent: dict[int, tuple[int, str]] = {}
    queue, seen = deque([start]), {start}
    while queue:
        state = queue.popleft()
        if state == goal:
            break
        if flat[state] == "H":
            continue
        for move, action in MOVES.items():
            ((_prob, nxt, _reward, _terminated),) = transitions[state][action]
            if nxt not in seen:
                seen.add(nxt)
                parent[nxt] = (state, move)
                queue.append(nxt)
    if goal not in seen:
        raise ValueError(f"map has no path from S to G: {rows}")
    moves: list[str] = []
    while goal != start:
        goal, move = parent[goal]
        moves.append(move)
    return moves[::-1]


@dataclass(frozen=True)
class _State:
    """Everything that changes during an episode; immutable, so snapshots are free.

    ``rng_state`` is numpy's bit-generator state dict; it is only ever replaced,
    never mutated.
    """

    task: Task
    position: int
    rng_state: dict[str, Any]
    turn: int = 0
    done: bool = False


class FrozenLakeEnv(ImmutableStateEnv):
    """Walk a FrozenLake map to the goal, one move per turn."""

    state_type = _State

    def __init__(
        self,
        *,
        is_slippery: bool = False,
        max_turns: int | None = None,
        turn_cost: float = 0.0,
        fmt: str = "tags",
        seed: int = 0,
        system_prompt: str = SYSTEM_PROMPT,
    ) -> None:
        """``max_turns=None`` means ``size * size`` (always enough for a shortest path).
        ``seed`` is mixed with the task's seed to seed slippery transitions."""
        self.is_slippery = is_slippery
        self.max_turns = max_turns
        self.turn_cost = float(turn_cost)
        self.fmt = fmt
        self.seed = seed
        self.system_prompt = system_prompt
        self._state: _State | None = None
        self._lake: Any = None  # gymnasium env of the current map, rebuilt when it changes
        self._lake_rows: tuple[str, ...] | None = None

    def _gym(self, rows: tuple[str, ...]) -> Any:
        """This instance's gymnasium env for ``rows`` (its position and RNG state are
        overwritten from ``self._state`` before every step)."""
        if rows != self._lake_rows:
            self._lake, self._lake_rows = _gym_lake(rows, self.is_slippery), rows
        return self._lake

    def _rows(self, task: Task) -> tuple[str, ...]:
        return tuple(task.payload["map"])

    def _max_turns(self, task: Task) -> int:
        return self.max_turns or len(self._rows(task)) ** 2

    def reset(self, task: Task) -> list[Message]:
        lake = self._gym(self._rows(task))
        position, _ = lake.reset(seed=(int(task.payload.get("seed", 0)) * 1_000_003 + self.seed))
        rng_state = lake.np_random.bit_generator.state
        self._state = _State(task=task, position=int(position), rng_state=rng_state)
        board = render_board(self._rows(task), self._state.position)
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": board},
        ]

    def parse_move(self, response: str) -> str | Malformed:
        """A move word from ``<answer>move</answer>`` or a bare move word."""
        word = response.strip().lower() if isinstance(response, str) else ""
        if word in MOVES:
            return word
        action = parse_response(response, self.fmt, tool_names=())
        if isinstance(action, FinalAnswer):
            word = action.text.strip().lower()
            if word in MOVES:
                return word
            return Malformed(f"unknown move {action.text[:20]!r}; use left, down, right or up")
        if isinstance(action, Malformed):
            return action
        return Malformed("no tools here")

    def check_response(self, task: Task, response: str) -> str | None:
        move = self.parse_move(response)
        return move.reason if isinstance(move, Malformed) else None

    def step(self, response: str) -> StepResult:
        state = self._require_state()
        rows = self._rows(state.task)
        move = self.parse_move(response)
        info: dict[str, Any] = {
            "turn": state.turn,
            "tool_call": False,
            "malformed": isinstance(move, Malformed),
            "error": move.reason if isinstance(move, Malformed) else None,
            "answered": not isinstance(move, Malformed),
            "correct": None,
            "truncated": False,
            "move": None if isinstance(move, Malformed) else move,
        }
        reward = 0.0 - self.turn_cost  # 0.0 - x avoids a -0.0 reward
        position, rng_state, terminated = state.position, state.rng_state, False
        if not isinstance(move, Malformed):
            lake = self._gym(rows)
            lake.s = position
            lake.np_random.bit_generator.state = rng_state
            position, gym_reward, terminated, _, _ = lake.step(MOVES[move])
            position = int(position)
            rng_state = lake.np_random.bit_generator.state
            reward += float(gym_reward)
        turn = state.turn + 1
        truncated = not terminated and turn >= self._max_turns(state.task)
        done = terminated or truncated
        self._state = replace(state, position=position, rng_state=rng_state, turn=turn, done=done)
        info.update(position=position, truncated=truncated, state_key=self.state_key())
        if done:
            info["correct"] = "".join(rows)[position] == "G"
            return StepResult(None, reward, True, info)
        board = render_board(rows, position)
        if isinstance(move, Malformed):
            content = f"Invalid: {move.reason}. Reply {format_answer('left')} etc.\n{board}"
        else:
            content = board
        return StepResult({"role": "user", "content": content}, reward, False, info)

    def state_key(self) -> str | None:
        if self._state is None:
            return None
        return f"{self._state.task.task_id}:{self._state.position}"


def demonstration(task: Task, **env_kwargs: Any) -> list[Message]:
    """The conversation of a shortest path to the goal (BFS, non-slippery ice).

    Moves are written ``<answer>move</answer>``; observations come from stepping a
    real non-slippery :class:`FrozenLakeEnv`. The whole path is demonstrated even
    when the training env's ``max_turns`` is shorter (``max_turns`` is ignored here).
    """
    env = FrozenLakeEnv(**{**env_kwargs, "is_slippery": False, "max_turns": None})
    messages = env.reset(task)
    result = None
    for move in shortest_path(tuple(task.payload["map"])):
        response = format_answer(move)
        messages.append({"role": "assistant", "content": response})
        result = env.step(response)
        if result.observation is not None:
            messages.append(result.observation)
    if result is None or not result.info["correct"]:
        raise RuntimeError(f"demonstration did not reach the goal on {task.task_id}")
    return messages
