"""The episode loop shared by all negotiation settings, and helpers for tasks and demos.

A setting subclasses :class:`NegotiationEnv` and supplies only the counterpart:
its rules text, its opening (:meth:`~NegotiationEnv.open`), its reaction to one
parsed action (:meth:`~NegotiationEnv.respond`), and what the agent has when time
runs out (:meth:`~NegotiationEnv.on_timeout`). This class owns parsing, the turn
limit, malformed replies, rewards, ``info``, snapshots and state keys.

Episode: ``reset`` gives ``[system, user]`` (short rules, then the counterpart's
opening line). Each agent reply is one action (:mod:`.actions`); the counterpart
answers with one short ``"user"`` message. A malformed reply, or an action that
makes no sense at that point (``<accept/>`` with nothing on the table), wastes the
turn: the counterpart is unchanged and the agent is told what was wrong. The
episode ends on a deal, a walk-out, ``<end/>``, or after ``max_turns`` agent turns.
The reward is paid only on the last step: the agent's deal value, normalised to
about [0, 1] by the setting, 0 without a deal.

``info`` per step: ``turn``, ``tool_call`` (always False), ``malformed``,
``error``, ``action`` (``"offer"|"accept"|"reject"|"end"|"say"|None``), ``offer``
(dict or None), ``reply`` (the counterpart's text, also on the last step, where
the observation is ``None``), ``outcome`` (None until done, then how it ended:
``"deal"`` (the counterpart agreed), ``"walkout"`` (it left), ``"ended"`` (the
agent wrote ``<end/>``), ``"timeout"`` (``max_turns`` cut it off) or
``"complete"`` (a game of exactly ``max_turns`` rounds finished)), ``deal`` and
``correct`` (None until done, then whether the agent secured any value: a sale,
an accepted round), ``value`` (None until done), ``truncated`` (outcome is
``"timeout"``), ``state_key``, and whatever the setting adds.

``state_key`` hashes the task id, the turn index and the counterpart's full
(hidden) state: two conversations that leave the counterpart in the same state at
the same turn are the same decision point for the environment (GiGPO's anchor
states), even when the agent's wording differed.
"""

from __future__ import annotations

import hashlib
import json
import random
from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from turnrl.envs.episode_state import ImmutableStateEnv
from turnrl.envs.negotiation.actions import (
    Accept,
    Action,
    End,
    Offer,
    OfferFormat,
    Reject,
    Say,
    parse_action,
)
from turnrl.envs.tools import Malformed
from turnrl.types import Message, StepResult, Task

OUTCOMES = ("deal", "walkout", "ended", "timeout", "complete")


@dataclass(frozen=True)
class Reply:
    """The counterpart's reaction to one action.

    ``counterpart``: its new (frozen) state. ``outcome``: ``None`` to go on, else
    how the episode ends (``"deal"``, ``"walkout"``, ``"ended"``), with the agent's
    normalised ``value`` and whether it counts as a ``deal``. ``invalid``: the
    action made no sense here (reported as malformed; the state should be unchanged).
    """

    text: str
    counterpart: Any
    outcome: str | None = None
    value: float = 0.0
    deal: bool = False
    invalid: str | None = None
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _State:
    """Everything that changes during an episode (immutable, so snapshots are free)."""

    task: Task
    counterpart: Any
    turn: int = 0
    done: bool = False


def _kind(action: Action) -> str | None:
    kinds = {Offer: "offer", Accept: "accept", Reject: "reject", End: "end", Say: "say"}
    return kinds.get(type(action))


class NegotiationEnv(ImmutableStateEnv):
    """A negotiation with a scripted, persona-driven counterpart (subclass per setting)."""

    state_type = _State

    def __init__(self, *, max_turns: int = 6) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self._state: _State | None = None

    # -- what a setting supplies -------------------------------------------------

    @abstractmethod
    def offer_format(self, task: Task) -> OfferFormat:
        """What offers may contain for ``task``."""

    @abstractmethod
    def system_prompt(self, task: Task) -> str:
        """Short rules, with the public facts of ``task``."""

    @abstractmethod
    def open(self, task: Task) -> tuple[Any, str]:
        """The counterpart's initial state and opening line."""

    @abstractmethod
    def respond(self, task: Task, counterpart: Any, action: Action, turn: int) -> Reply:
        """React to a well-formed ``action`` at 0-based agent ``turn``."""

    ends_at_max_turns = False
    """Whether ``max_turns`` is the natural end of the game (outcome ``"complete"``, not
    truncated) rather than a deadline that cuts the conversation off (``"timeout"``)."""

    def on_timeout(self, task: Task, counterpart: Any) -> tuple[float, bool]:
        """``(value, deal)`` when ``max_turns`` run out; default: no deal."""
        return 0.0, False

    # -- Env API -----------------------------------------------------------------

    def reset(self, task: Task) -> list[Message]:
        counterpart, opening = self.open(task)
        self._state = _State(task=task, counterpart=counterpart)
        return [
            {"role": "system", "content": self.system_prompt(task)},
            {"role": "user", "content": opening},
        ]

    def step(self, response: str) -> StepResult:
        state = self._require_state()
        action = parse_action(response, self.offer_format(state.task))
        if isinstance(action, Malformed):
            reply = Reply(f"Invalid: {action.reason}.", state.counterpart, invalid=action.reason)
        else:
            reply = self.respond(state.task, state.counterpart, action, state.turn)
        turn = state.turn + 1
        outcome, value, deal = reply.outcome, reply.value, reply.deal
        if outcome is None and turn >= self.max_turns:
            outcome = "complete" if self.ends_at_max_turns else "timeout"
            value, deal = self.on_timeout(state.task, reply.counterpart)
        done = outcome is not None
        self._state = replace(state, counterpart=reply.counterpart, turn=turn, done=done)
        info: dict[str, Any] = {
            "turn": state.turn,
            "tool_call": False,
            "malformed": reply.invalid is not None,
            "error": reply.invalid,
            "action": _kind(action),
            "offer": action.as_dict() if isinstance(action, Offer) else None,
            "reply": reply.text,
            "outcome": outcome,
            "deal": deal if done else None,
            "correct": deal if done else None,
            "value": float(value) if done else None,
            "truncated": outcome == "timeout",
            **reply.info,
            "state_key": self.state_key(),
        }
        if done:
            return StepResult(None, float(value), True, info)
        return StepResult({"role": "user", "content": reply.text}, 0.0, False, info)

    def check_response(self, task: Task, response: str) -> str | None:
        action = parse_action(response, self.offer_format(task))
        return action.reason if isinstance(action, Malformed) else None

    def state_key(self) -> str | None:
        if self._state is None:
            return None
        s = self._state
        text = f"{s.task.task_id}\x1f{s.turn}\x1f{s.done}\x1f{s.counterpart!r}"
        return hashlib.sha1(text.encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- tasks


def make_tasks(
    setting: str, n: int, seed: int, draw: Callable[[random.Random], dict[str, Any]]
) -> list[Task]:
    """``n`` tasks of ``setting``, each payload drawn by ``draw`` from its own seeded RNG.

    Task ``i`` uses ``random.Random(f"{setting}:{seed}:{i}")``, so a task does not
    depend on ``n``. The id is the setting plus a hash of the payload: the same
    persona always gets the same id.
    """
    if n < 0:
        raise ValueError(f"need n >= 0, got {n}")
    tasks = []
    for i in range(n):
        payload = draw(random.Random(f"{setting}:{seed}:{i}"))
        digest = hashlib.sha1(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]
        tasks.append(Task(task_id=f"{setting}-{digest}", payload=payload, tags=(setting,)))
    return tasks


def public(task: Task) -> dict[str, Any]:
    """What the agent may know of a task: the payload without its hidden ``persona``."""
    return {k: v for k, v in task.payload.items() if k != "persona"}


# ----------------------------------------------------------------------------- demos

Agent = Callable[[str], str]
"""A scripted agent: the counterpart's latest message in, the agent's reply out."""


def play(env: NegotiationEnv, task: Task, agent: Agent) -> tuple[list[Message], StepResult]:
    """Run ``agent`` against ``env`` on ``task``; the full conversation and the last step."""
    messages = env.reset(task)
    result: StepResult | None = None
    while result is None or not result.done:
        response = agent(messages[-1]["content"])
        messages.append({"role": "assistant", "content": response})
        result = env.step(response)
        if result.observation is not None:
            messages.append(result.observation)
    return messages, result


STYLES = ("weak", "medium", "strong")
"""Demonstration strengths: ``weak`` concedes fast, ``strong`` anchors well and concedes slowly."""


def check_style(style: str) -> str:
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; known: {', '.join(STYLES)}")
    return style
