"""Persona-style exploration for deployments: hidden instructions that vary behaviour.

Iterative GRPO fits ``Q^pi`` only on actions the deployed policy took, so a batch
where every conversation opens the same way tells Q nothing about alternatives
(the paper names coverage of actions as the main risk and explores by varying
tone and length). Besides sampling temperature, a deployment can give a share of
its conversations an *exploration persona*: an instruction appended to the
system message the policy reads ("Open high and concede slowly."), which the
counterpart never sees.

The instruction is an internal nudge of the agent, not part of the
conversation's state, so the logs hold the state without it: each record's
``prompt_ids`` has the instructed opening replaced by the plain one (the rest of
the context, made of the agent's responses and the counterpart's replies, is
unchanged), and the record names its ``persona``. Q is then fitted on states the
uninstructed policy also reaches, and the improvement step samples candidates in
them. The recorded ``logprobs`` stay those of the instructed (behaviour) policy.

Departure, and a bias to know about: the persona stays for the whole
conversation, so the Monte Carlo returns of its turns are those of the
instructed policy, not of ``pi``. Q^pi is estimated from a mixture of ``pi`` and
its persona variants (the paper's deployments mix them the same way).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from turnrl.rollout import RolloutBatch
from turnrl.types import (
    Env,
    Message,
    Policy,
    References,
    ResponseChecks,
    Snapshots,
    StepResult,
    Task,
    Truncation,
    require,
    state_key_of,
)


def with_instruction(messages: Sequence[Message], instruction: str) -> list[Message]:
    """The messages with ``instruction`` appended to the first system message
    (or, without one, a new system message in front)."""
    out = [dict(m) for m in messages]
    for message in out:
        if message.get("role") == "system":
            message["content"] = f"{message.get('content') or ''}\n{instruction}".lstrip("\n")
            return out
    return [{"role": "system", "content": instruction}, *out]


class PersonaEnv(Env):
    """Wraps an environment so that ``reset`` adds an exploration instruction.

    Everything else is the wrapped environment's. ``plain_messages`` and
    ``instructed_messages`` keep the last reset's two versions, so the logs can be
    rewritten to the plain state (:func:`hide_personas`). It has every optional
    capability its wrapped environment may have; one the wrapped environment lacks
    means what it means without it (no state key, no reference, every response well
    formed, a cut response stepped as any), and a snapshot is refused by name.
    """

    def __init__(self, inner: Env, instruction: str) -> None:
        if not instruction.strip():
            raise ValueError("an exploration persona needs a non-empty instruction")
        self.inner = inner
        self.instruction = instruction
        self.plain_messages: list[Message] = []
        self.instructed_messages: list[Message] = []

    def reset(self, task: Task) -> list[Message]:
        self.plain_messages = list(self.inner.reset(task))
        self.instructed_messages = with_instruction(self.plain_messages, self.instruction)
        return self.instructed_messages

    def step(self, response: str) -> StepResult:
        return self.inner.step(response)

    def step_truncated(self, response: str) -> StepResult:
        if isinstance(self.inner, Truncation):
            return self.inner.step_truncated(response)
        return self.inner.step(response)

    def snapshot(self) -> Any:
        inner = require(self.inner, Snapshots, "a persona environment's snapshot").snapshot()
        return (inner, self.plain_messages, self.instructed_messages)

    def restore(self, snapshot: Any) -> None:
        inner, plain, instructed = snapshot
        require(self.inner, Snapshots, "a persona environment's restore").restore(inner)
        self.plain_messages, self.instructed_messages = list(plain), list(instructed)

    def state_key(self) -> str | None:
        return state_key_of(self.inner)

    def reference_response(self, task: Task) -> str | None:
        if isinstance(self.inner, References):
            return self.inner.reference_response(task)
        return None

    def check_response(self, task: Task, response: str) -> str | None:
        if isinstance(self.inner, ResponseChecks):
            return self.inner.check_response(task, response)
        return None


def persona_env_factory(make_env: Callable[[], Env], instruction: str) -> Callable[[], Env]:
    """``make_env`` whose environments carry ``instruction`` (none when it is empty)."""
    if not instruction:
        return make_env
    return lambda: PersonaEnv(make_env(), instruction)


def hide_personas(policy: Policy, batch: RolloutBatch, persona: int) -> None:
    """Rewrite the batch's records to the plain (uninstructed) states, in place.

    Each record of an episode run in a :class:`PersonaEnv` gets ``prompt_ids``
    with the instructed opening replaced by the plain one, and ``persona`` (its
    index in ``deploy.personas``). Records of plain environments only get
    ``persona``. Raises ``ValueError`` if a record does not start with its
    episode's instructed opening (a context built some other way).
    """
    openings: dict[str, tuple[list[int], list[int]]] = {}
    for episode in batch.episodes:
        if isinstance(episode.env, PersonaEnv):
            openings[episode.traj_id] = (
                policy.encode_initial(episode.env.instructed_messages),
                policy.encode_initial(episode.env.plain_messages),
            )
    rewritten = []
    for record in batch.records:
        record = dataclasses.replace(record, persona=persona)
        if record.traj_id in openings:
            instructed, plain = openings[record.traj_id]
            ids = record.prompt_ids or ()
            if list(ids[: len(instructed)]) != instructed:
                raise ValueError(
                    f"record {record.traj_id} turn {record.turn}: prompt_ids do not start "
                    "with the episode's instructed opening"
                )
            record = dataclasses.replace(record, prompt_ids=(*plain, *ids[len(instructed) :]))
        rewritten.append(record)
    batch.records = rewritten
