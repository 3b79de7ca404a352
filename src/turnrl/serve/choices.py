"""Several choices of one call (``n`` > 1): their seeds, and which one the record keeps.

A framework asking for ``n`` choices (self-consistency, best-of-n) gets ``n`` responses
sampled from the same exact context, ``choices[i].index = i``. One call is still one
turn of one trajectory, so its turn record holds one choice's tokens, and the others go
with it as its *siblings*: samples from the same state whose outcome nobody observed.

Which choice the record holds. The gateway compares the role's next request with what
it returned (:mod:`turnrl.serve.conversation`): the request that extends choice ``k``
(its assistant message, compared like any reply) says the agent continued ``k``. Until
then, and for good when no request ever does (the rollout's last call, an agent that
voted over the choices or rewrote them), the record holds choice 0 and says it was not
continued. The record's extra fields (``docs/gateway.md``):

* ``choice``: the index of the choice whose tokens the record holds;
* ``continued``: whether the role's next request extended that choice;
* ``siblings``: the other choices in index order, each ``{"index", "response",
  "response_ids", "logprobs", "finish_reason", "stop_reason"}``.

Training. A continued choice trains like any turn (the trajectory's outcome followed
from it). A record whose choice was not continued is ``train: false``: the reward the
agent posts may come from any of the choices (or all of them, by a vote), so crediting
choice 0's tokens with it would be a guess; the turn still shapes the trajectory's
returns. Siblings never train and never enter credit: they have no outcome of their
own, and the turn-record format has no leaf without one (every trajectory's outcome is
the sum of its rewards, so a sibling written as its own trajectory would count as an
episode that scored 0). They are kept for inspection and for methods that score
candidates without an outcome (a learned Q function, as Iterative GRPO does).

Seeds. With ``seed``, choice ``i`` is sampled alone with :func:`choice_seeds`'s seed
``i``, so its tokens are those of a single call with that seed (choice 0: the request's
own seed); without, the choices are rows of one batched call.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any

from turnrl.serve.rollouts import PendingChoices
from turnrl.types import TurnRecord

SEED_BITS = 63
"""Derived seeds are non-negative and below ``2**63``: valid ``seed`` values of a request."""


def choice_seeds(seed: int | None, n: int) -> list[int | None]:
    """The seed each of ``n`` choices is sampled with: ``None`` for every choice without
    a seed; with one, ``seed`` itself for choice 0 (so ``n = 1`` samples as before) and
    for choice ``i > 0`` the first 63 bits of ``blake2b("turnrl-choice:{seed}:{i}")``
    (a fixed function of the request's seed, independent across choices)."""
    if seed is None:
        return [None] * n
    seeds: list[int | None] = [seed]
    for i in range(1, n):
        digest = hashlib.blake2b(f"turnrl-choice:{seed}:{i}".encode(), digest_size=8).digest()
        seeds.append(int.from_bytes(digest, "big") >> (64 - SEED_BITS))
    return seeds


def sibling(index: int, record: TurnRecord) -> dict[str, Any]:
    """A choice not continued, as the ``siblings`` entry of the record."""
    return {
        "index": index,
        "response": record.response,
        "response_ids": list(record.response_ids or ()),
        "logprobs": list(record.logprobs or ()),
        "finish_reason": record.finish_reason,
        "stop_reason": record.stop_reason,
    }


def holding(
    record: TurnRecord, choices: Sequence[TurnRecord], k: int, *, continued: bool
) -> TurnRecord:
    """``record`` (the turn as it stands: task id, reward, done) holding choice ``k`` of
    ``choices`` (each choice's record as :func:`~turnrl.serve.turnrecords.build_record`
    made it), with the others as siblings; trained only when ``continued``."""
    chosen = choices[k]
    extra = {
        **record.extra,
        "choice": k,
        "continued": continued,
        "siblings": [sibling(i, c) for i, c in enumerate(choices) if i != k],
    }
    return dataclasses.replace(
        record,
        response=chosen.response,
        response_ids=chosen.response_ids,
        logprobs=chosen.logprobs,
        stop_reason=chosen.stop_reason,
        finish_reason=chosen.finish_reason,
        tool_call=chosen.tool_call,
        train=continued and chosen.train,
        extra=extra,
    )


def first_record(
    choices: Sequence[TurnRecord], turn: int
) -> tuple[TurnRecord, PendingChoices | None]:
    """The record a call appends as record ``turn`` of its rollout, and what stays
    pending: its only choice as is (``n = 1``), or choice 0 not (yet) continued, with
    every choice kept for :func:`continue_choice`."""
    if len(choices) == 1:
        return choices[0], None
    return holding(choices[0], choices, 0, continued=False), PendingChoices(turn, tuple(choices))


def continue_choice(records: list[TurnRecord], pending: PendingChoices, k: int) -> None:
    """The agent continued choice ``k`` of ``pending``: its record now holds ``k``."""
    records[pending.turn] = holding(records[pending.turn], pending.records, k, continued=True)
