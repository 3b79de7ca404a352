"""Rollout state: one conversation per role, the request in flight, timeouts, used ids.

A rollout is one agent run (one trajectory). Each *role* (the ``model`` name a
request asks for) has its own :class:`Conversation` in it: the token context
the next request must extend, the tool set, and the last request with its
result (to answer a retried request without sampling again). ``turn`` numbers
the rollout's calls across roles.

:class:`RolloutTable` holds the open rollouts under one condition variable
(the gateway's lock; waiters are woken whenever a rollout's request ends) and
remembers the ids of closed ones, so that a late call on a finished, timed-out
or discarded rollout gets a clear 409 instead of silently starting a new
trajectory with an old id. Rollouts are kept in the order they were opened,
which makes the timeout sweep stop at the first one still in time.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from turnrl.serve.errors import GatewayError
from turnrl.serve.protocol import ChatRequest, ToolSpec
from turnrl.types import Message, TurnRecord

CLOSED_IDS_KEPT = 65_536
"""Closed rollout ids remembered (oldest forgotten first), to refuse late calls."""

PROBLEMS_KEPT = 8
"""Refused calls and refused rewards remembered per rollout (the last ones)."""

TRUNCATED_AT_CONTEXT = "context"
"""``Rollout.truncated`` of a rollout that ended at the per-turn context cap (what an
environment episode's ``Episode.end`` says when it ends for lack of context)."""


@dataclass(frozen=True)
class Offered:
    """One choice the last call returned, as the role's next request may continue it."""

    key: Any
    """Key of the assistant message (what the next request must carry to extend it)."""
    response: str
    """The sampled text, kept as the assistant turn of the next prompt."""
    context: list[int]
    """Ids the next turn extends: prompt_ids + response_ids (+ end-of-turn)."""


@dataclass(frozen=True)
class PendingChoices:
    """A call with several choices whose record does not yet say which one the agent
    continued (:mod:`turnrl.serve.choices`)."""

    turn: int
    """Index of its record in the rollout's records."""
    records: tuple[TurnRecord, ...]
    """The record each choice would have, by choice index."""


@dataclass
class Conversation:
    """One role's conversation in a rollout (mutated under the table's lock, or by
    the one request that holds the rollout)."""

    keys: tuple[Any, ...] = ()
    """Message keys of the previous request."""
    tools: tuple[ToolSpec, ...] = ()
    """The conversation's tool set: fixed by the first request that sends tools, kept
    when a later request sends none, replaced only by a different non-empty set."""
    offered: tuple[Offered, ...] = ()
    """The choices returned last, by index (empty before the first turn; one unless the
    request asked for ``n`` > 1)."""
    pending: PendingChoices | None = None
    """The last call's choices while no request has continued one of them (``n`` > 1)."""
    prompt: list[Message] = field(default_factory=list)
    last_request: ChatRequest | None = None
    last_result: dict[str, Any] | None = None
    """The response body of ``last_request`` (returned again to a retry of it)."""


@dataclass
class Rollout:
    """One trajectory in progress."""

    rollout_id: str
    task_id: str
    task_id_explicit: bool
    opened_at: float
    pinned: bool = False
    """Opened explicitly (``open_rollout``): kept even while it has no turn."""
    records: list[TurnRecord] = field(default_factory=list)
    conversations: dict[str, Conversation] = field(default_factory=dict)
    in_flight: tuple[str, ChatRequest] | None = None
    """Role and request being answered (a rollout answers one request at a time)."""
    finished: bool = False
    reward: float | None = None
    rebuilds: int = 0
    closed: str | None = None
    """Why the rollout was closed without finishing (``timeout``, ``idle`` or
    ``discarded: ...``)."""
    truncated: str | None = None
    """``"context"`` once a call was refused at the per-turn context cap
    (``GatewayConfig.max_context_tokens``): no later call is sampled; the reward may
    still be posted."""
    secret: str | None = None
    """The rollout's own secret (``open_rollout``): every call and reward naming it
    must carry it; ``None`` for rollouts a first call started (``turnrl serve``)."""
    last_active: float = 0.0
    """When a request on it last ended (or it was opened): the idle clock."""
    refusals: deque[str] = field(default_factory=lambda: deque(maxlen=PROBLEMS_KEPT))
    """The gateway's answers to its refused calls (``"400 messages[0].role: ..."``)."""
    refused_rewards: deque[float] = field(default_factory=lambda: deque(maxlen=PROBLEMS_KEPT))
    """Rewards posted after its reward, different from it (refused with a 409)."""

    def policy_versions(self) -> tuple[int, ...]:
        """Distinct versions of the weights its turns were sampled with, sorted."""
        return tuple(sorted({int(r.policy_version or 0) for r in self.records}))

    def summary(self) -> dict[str, Any]:
        return {
            "rollout_id": self.rollout_id,
            "task_id": self.task_id,
            "turns": len(self.records),
            "finished": self.finished,
            "reward": self.reward,
            "context_rebuilds": self.rebuilds,
            "policy_versions": list(self.policy_versions()),
            **({"truncated": self.truncated} if self.truncated is not None else {}),
        }


def check_secret(state: Rollout, secret: str | None) -> None:
    """403 unless ``secret`` is the rollout's (``None``: an in-process caller, trusted;
    rollouts a first call started have no secret). Compared in constant time."""
    if state.secret is None or secret is None:
        return
    if not hmac.compare_digest(state.secret.encode(), secret.encode()):
        raise GatewayError(
            403,
            f"rollout {state.rollout_id!r}: wrong or missing rollout secret; use the "
            "URLs the training loop handed to this rollout's agent",
            param="rollout_id",
            code="wrong_rollout_secret",
        )


@dataclass(frozen=True)
class FinishedRollout:
    """A rollout with its reward, as the training loop collects it."""

    rollout_id: str
    task_id: str
    reward: float
    records: tuple[TurnRecord, ...]
    """Its turn records, in order (the reward is on the last one, with ``done``)."""
    policy_versions: tuple[int, ...]
    """Sorted distinct ``policy_version`` of its turns (empty when it has none)."""
    context_rebuilds: int
    truncated: str | None = None
    """``"context"``: it ended at the per-turn context cap (see :attr:`Rollout.truncated`)."""

    @property
    def mixed_versions(self) -> bool:
        """Whether its turns were sampled with more than one version of the weights
        (a synchronous loop refuses such a rollout for training)."""
        return len(self.policy_versions) > 1


@dataclass(frozen=True)
class ClosedRollout:
    """A rollout closed without a reward: dropped, only counted."""

    rollout_id: str
    task_id: str
    turns: int
    reason: str
    """``"timeout"``, ``"idle"`` or ``"discarded: <the caller's reason>"``."""


@dataclass(frozen=True)
class _Tombstone:
    reason: str
    """``"finished"``, ``"timeout"`` or ``"discarded: ..."``."""
    reward: float | None = None


class RolloutTable:
    """Open rollouts by id, closed ids, and the counters, under one condition."""

    def __init__(
        self,
        *,
        timeout_s: float | None,
        idle_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cond = threading.Condition()
        """Guards everything here; notified whenever a rollout's request ends."""
        self.timeout_s = timeout_s
        self.idle_s = idle_s
        self.clock = clock
        self.open: OrderedDict[str, Rollout] = OrderedDict()
        self._closed: OrderedDict[str, _Tombstone] = OrderedDict()
        self.closed_log: deque[ClosedRollout] = deque(maxlen=CLOSED_IDS_KEPT)
        """Rollouts closed without a reward, not yet collected by ``pop_closed``."""
        self.counts = {"finished": 0, "timed_out": 0, "idle_closed": 0, "discarded": 0}

    # ----------------------------------------------------------------- lookups
    def refuse_closed(self, rollout_id: str) -> None:
        """409 if ``rollout_id`` was used by a rollout that is now closed."""
        tomb = self._closed.get(rollout_id)
        if tomb is not None:
            raise GatewayError(
                409,
                f"rollout {rollout_id!r} is closed ({tomb.reason}); use a fresh rollout id",
                code="rollout_closed",
            )

    def tombstone(self, rollout_id: str) -> _Tombstone | None:
        return self._closed.get(rollout_id)

    def get(self, rollout_id: str) -> Rollout:
        """The open rollout; 409 if closed, 404 if never seen."""
        state = self.open.get(rollout_id)
        if state is None:
            self.refuse_closed(rollout_id)
            raise GatewayError(404, f"unknown rollout {rollout_id!r}", param="rollout_id")
        return state

    def get_or_create(
        self, rollout_id: str, task_id: str | None, *, pinned: bool, secret: str | None = None
    ) -> Rollout:
        state = self.open.get(rollout_id)
        if state is None:
            self.refuse_closed(rollout_id)
            now = self.clock()
            state = Rollout(
                rollout_id,
                task_id or rollout_id,
                task_id is not None,
                opened_at=now,
                pinned=pinned,
                secret=secret,
                last_active=now,
            )
            self.open[rollout_id] = state
        return state

    def lookup(
        self, rollout_id: str, task_id: str | None, secret: str | None, *, create: bool
    ) -> Rollout:
        """The rollout a call names, started here when ``create`` (``turnrl serve``); 404
        when not open and not ``create`` (the agent loop serves only what it opened), 409
        when closed, 403 for a wrong secret."""
        if create or rollout_id in self.open:
            state = self.get_or_create(rollout_id, task_id, pinned=False)
        else:
            self.refuse_closed(rollout_id)
            raise GatewayError(
                404,
                f"unknown rollout {rollout_id!r}: this gateway serves only the rollouts "
                "its training loop opened",
                param="rollout_id",
                code="rollout_not_open",
            )
        check_secret(state, secret)
        return state

    # ----------------------------------------------------------------- problems
    def note_refusal(self, rollout_id: str, secret: str | None, text: str) -> None:
        """Remember a refused call's answer on its rollout (not for unknown rollouts, nor
        for a caller without the rollout's secret: it cannot write into its report)."""
        state = self.open.get(rollout_id)
        if state is None:
            return
        try:
            check_secret(state, secret)
        except GatewayError:
            return
        state.refusals.append(text)

    def problems(self, rollout_id: str) -> tuple[list[str], list[float]]:
        """Refused calls and refused second rewards of an open rollout (none if unknown)."""
        state = self.open.get(rollout_id)
        if state is None:
            return [], []
        return list(state.refusals), list(state.refused_rewards)

    # ----------------------------------------------------------------- closing
    def _bury(self, state: Rollout, tomb: _Tombstone) -> None:
        self.open.pop(state.rollout_id, None)
        self._closed[state.rollout_id] = tomb
        while len(self._closed) > CLOSED_IDS_KEPT:
            self._closed.popitem(last=False)
        self.cond.notify_all()

    def close(self, state: Rollout, reason: str) -> ClosedRollout:
        """Drop an unfinished rollout (timeout or discard); counted and logged."""
        state.closed = reason
        self._bury(state, _Tombstone(reason))
        closed = ClosedRollout(state.rollout_id, state.task_id, len(state.records), reason)
        self.closed_log.append(closed)
        counter = {"timeout": "timed_out", "idle": "idle_closed"}.get(reason, "discarded")
        self.counts[counter] += 1
        return closed

    def forget_finished(self, state: Rollout) -> None:
        """Forget a finished rollout (collected, or past the keep limit)."""
        self._bury(state, _Tombstone("finished", state.reward))

    def expired(self, now: float) -> list[tuple[Rollout, str]]:
        """Unfinished rollouts past a deadline at ``now``, with the reason: ``"timeout"``
        (opened more than ``timeout_s`` ago) or ``"idle"`` (no request for ``idle_s``,
        none in flight). Finished rollouts (kept until collected) are never expired,
        however old: their reward is in."""
        out: list[tuple[Rollout, str]] = []
        for state in self.open.values():
            if state.finished:
                continue
            if self.timeout_s is not None and state.opened_at + self.timeout_s <= now:
                out.append((state, "timeout"))
            elif (
                self.idle_s is not None
                and state.in_flight is None
                and state.last_active + self.idle_s <= now
            ):
                out.append((state, "idle"))
        return out
