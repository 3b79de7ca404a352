"""The rollout registry: opening, claiming, finishing, expiring and reading rollouts.

Rollout state lives in a :class:`~turnrl.serve.rollouts.RolloutTable` under one
condition variable; every method here takes it. A rollout answers one request at
a time: :meth:`RolloutRegistry.claim` waits while it answers another, and answers
a retry (a request equal to the role's last one, e.g. an OpenAI client retrying
after a timeout) with that call's stored result, so it is recorded once.
:class:`RolloutViews` reads what the rollouts hold (summaries, records, the
finished ones a trainer collects).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Callable
from typing import Any

from turnrl.records import record_to_json
from turnrl.serve.config import GatewayConfig
from turnrl.serve.errors import GatewayError, bad_request
from turnrl.serve.limits import check_id
from turnrl.serve.protocol import ChatRequest
from turnrl.serve.rollouts import (
    ClosedRollout,
    Conversation,
    FinishedRollout,
    Rollout,
    RolloutTable,
    check_secret,
)
from turnrl.types import TurnRecord

logger = logging.getLogger("turnrl.serve")

SWEEP_INTERVAL_S = 1.0
"""Requests close timed-out rollouts at most this often (or a quarter of the timeout)."""

ROLLOUT_SECRET_BYTES = 24
"""Random bytes in a rollout's secret (``secrets.token_urlsafe``: 32 characters)."""


class RolloutRegistry:
    """The gateway's rollouts and their life: open, claim, record a turn, finish, close."""

    def __init__(self, config: GatewayConfig) -> None:
        timeout, idle = config.rollout_timeout_s, config.idle_timeout_s
        if timeout is not None and not timeout > 0:
            raise ValueError(f"rollout_timeout_s must be > 0, got {timeout}")
        if idle is not None and not idle > 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {idle}")
        self.config = config
        self.table = RolloutTable(timeout_s=timeout, idle_s=idle)
        self.context_rebuilds = 0
        """Turns whose context had to be re-encoded from text (history rewritten)."""
        self._next_sweep = 0.0
        self._closing = False

    def shut_down(self) -> None:
        """Refuse new work and wake the requests waiting for a rollout (they get a 503)."""
        with self.table.cond:
            self._closing = True
            self.table.cond.notify_all()

    # ------------------------------------------------------------ open and close
    def open(self, rollout_id: str, task_id: str | None = None) -> str:
        """Register a rollout before its first call; returns its secret."""
        check_id(rollout_id, "rollout_id")
        if task_id is not None:
            check_id(task_id, "task_id")
        secret = secrets.token_urlsafe(ROLLOUT_SECRET_BYTES)
        with self.table.cond:
            if rollout_id in self.table.open:
                raise ValueError(f"rollout {rollout_id!r} is already open")
            self.table.get_or_create(rollout_id, task_id, pinned=True, secret=secret)
        return secret

    def note_refusal(self, rollout_id: str, secret: str | None, error: GatewayError) -> None:
        """Remember that a call on ``rollout_id`` was refused (kept for the rollout's
        failure report; ignored for unknown rollouts and wrong secrets)."""
        where = f" ({error.param})" if error.param else ""
        with self.table.cond:
            self.table.note_refusal(
                rollout_id, secret, f"HTTP {error.status}{where}: {error.message}"
            )

    def problems(self, rollout_id: str) -> tuple[list[str], list[float]]:
        """The refused calls (the gateway's answers) and refused second rewards of an
        open rollout, oldest first (the last few of each)."""
        with self.table.cond:
            return self.table.problems(rollout_id)

    def discard(self, rollout_id: str, reason: str) -> ClosedRollout | None:
        """Drop a rollout (counted as ``discarded``); ``None`` if it is not open."""
        with self.table.cond:
            state = self.table.open.get(rollout_id)
            if state is None:
                return None
            closed = self.table.close(state, f"discarded: {reason}")
        logger.warning("rollout %r discarded (%s)", rollout_id, reason)
        return closed

    def close_expired(self, now: float | None = None) -> list[ClosedRollout]:
        """Close the rollouts without a reward ``rollout_timeout_s`` after they were
        opened (counted as ``timed_out``) or idle for ``idle_timeout_s`` (counted as
        ``idle_closed``); returns those closed now. Finished rollouts are kept."""
        with self.table.cond:
            table = self.table
            expired = table.expired(table.clock() if now is None else now)
            closed = [table.close(state, reason) for state, reason in expired]
        for c in closed:
            limit = (
                f"timed out after {self.config.rollout_timeout_s} s"
                if c.reason == "timeout"
                else f"was idle for {self.config.idle_timeout_s} s"
            )
            logger.warning(
                "rollout %r (task %r) %s without a reward; dropped (%d turns)",
                c.rollout_id,
                c.task_id,
                limit,
                c.turns,
            )
        return closed

    def sweep(self) -> None:
        """Close expired rollouts (not more often than ``SWEEP_INTERVAL_S``, or a quarter
        of the shortest timeout)."""
        now = self.table.clock()
        limits = [
            t for t in (self.config.rollout_timeout_s, self.config.idle_timeout_s) if t is not None
        ]
        if not limits or now < self._next_sweep:
            return
        self._next_sweep = now + min(SWEEP_INTERVAL_S, min(limits) / 4)
        self.close_expired(now)

    def pop_closed(self) -> list[ClosedRollout]:
        """Rollouts closed without a reward (timeouts, discards) since the last call."""
        with self.table.cond:
            out = list(self.table.closed_log)
            self.table.closed_log.clear()
            return out

    # ------------------------------------------------------------------- a call
    def check_access(self, rollout_id: str, secret: str | None) -> None:
        """Raise what a call naming ``rollout_id`` with ``secret`` would get before any
        work (a gateway subclass that does work before ``complete`` calls this first,
        and so does the HTTP app before it reads a reward)."""
        check_id(rollout_id, "rollout_id")
        with self.table.cond:
            if rollout_id in self.table.open or not self.config.auto_open:
                self.table.lookup(rollout_id, None, secret, create=False)

    def claim(
        self, request: ChatRequest, rollout_id: str, task_id: str | None, secret: str | None
    ) -> tuple[Rollout, Conversation] | dict[str, Any]:
        """Take the rollout for ``request``: waits while it answers another request;
        returns the stored result instead when ``request`` repeats the role's last."""
        role = request.role
        table = self.table

        def lookup() -> Rollout:
            return table.lookup(rollout_id, task_id, secret, create=self.config.auto_open)

        with table.cond:
            state = self._wait_idle(lookup)
            conversation = state.conversations.get(role)
            if (
                conversation is not None
                and conversation.last_result is not None
                and conversation.last_request == request
            ):
                return conversation.last_result
            if state.finished:
                raise GatewayError(
                    409,
                    f"rollout {rollout_id!r} is finished (its reward was posted)",
                    code="rollout_finished",
                )
            if state.truncated is not None:
                raise GatewayError(
                    400,
                    f"rollout {rollout_id!r} ended at the per-turn context cap (a call over "
                    "it was refused); no later call is sampled: post its reward",
                    param="messages",
                    code="context_length_exceeded",
                )
            if task_id is not None:
                self.set_task(state, task_id)
            state.in_flight = (role, request)
            return state, conversation or Conversation()

    def release(self, state: Rollout) -> None:
        """The claimed request is answered (or failed): wake the requests waiting."""
        with self.table.cond:
            state.in_flight = None
            state.last_active = self.table.clock()
            if not state.records and not state.pinned and state.closed is None:
                self.table.open.pop(state.rollout_id, None)  # a failed first call
            self.table.cond.notify_all()

    def end_truncated(self, state: Rollout, why: str) -> None:
        """The claimed rollout ends truncated (``why``: ``"context"``): its later calls
        are refused (:meth:`claim`); its reward may still be posted."""
        with self.table.cond:
            state.truncated = why

    def truncation(self, rollout_id: str) -> str | None:
        """Why an open rollout ended truncated (``"context"``), or ``None`` (also for a
        rollout that is not open)."""
        with self.table.cond:
            state = self.table.open.get(rollout_id)
            return None if state is None else state.truncated

    def record_turn(
        self,
        state: Rollout,
        role: str,
        conv: Conversation,
        record: TurnRecord,
        remember: Callable[[], None],
    ) -> None:
        """Append the claimed call's record and keep its conversation (``remember``
        updates ``conv``); nothing if the rollout was closed meanwhile (answered,
        not recorded)."""
        with self.table.cond:
            if state.closed is not None:
                return
            state.records.append(record)
            remember()
            state.conversations[role] = conv
            if record.context_rebuilt:
                state.rebuilds += 1
                self.context_rebuilds += 1

    def _wait_idle(self, lookup: Callable[[], Rollout]) -> Rollout:
        """The rollout ``lookup`` finds (again after every wake-up), once it answers no
        request. The caller holds the lock; waiting releases it."""
        while True:
            if self._closing:
                raise GatewayError(503, "the gateway is shutting down")
            state = lookup()
            if state.in_flight is None:
                return state
            self.table.cond.wait()

    @staticmethod
    def set_task(state: Rollout, task_id: str) -> None:
        """Fix the rollout's task id (once; a trajectory belongs to one task)."""
        if state.task_id_explicit and task_id != state.task_id:
            raise bad_request(
                f"rollout {state.rollout_id!r} belongs to task {state.task_id!r}, not {task_id!r}",
                "task_id",
            )
        state.task_id, state.task_id_explicit = task_id, True
        state.records = [dataclasses.replace(r, task_id=task_id) for r in state.records]

    # -------------------------------------------------------------------- reward
    def finish(
        self, rollout_id: str, value: float, task_id: str | None, secret: str | None
    ) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
        """Put the reward ``value`` on the rollout's last turn and finish it: its summary,
        and its records as JSON when they are new (``None`` for a repeated reward)."""
        table = self.table
        with table.cond:
            tomb = None if rollout_id in table.open else table.tombstone(rollout_id)
            if tomb is not None and tomb.reason == "finished" and tomb.reward == value:
                return {"rollout_id": rollout_id, "finished": True, "reward": value}, None
            state = self._wait_idle(lambda: table.get(rollout_id))  # 409 closed, 404 unknown
            check_secret(state, secret)
            if state.finished:
                if state.reward == value:
                    return {**state.summary(), "reward": value}, None
                state.refused_rewards.append(value)
                raise GatewayError(
                    409,
                    f"rollout {rollout_id!r} already has reward {state.reward}, not {value}",
                    code="rollout_finished",
                )
            if task_id is not None:
                self.set_task(state, task_id)
            if state.records:
                state.records[-1] = dataclasses.replace(state.records[-1], reward=value, done=True)
            state.finished, state.reward = True, value
            table.counts["finished"] += 1
            finished = [record_to_json(r) for r in state.records]
            summary = {**state.summary(), "reward": value}
            self._forget_old_finished()
        return summary, finished

    def _forget_old_finished(self) -> None:
        """Drop the oldest finished rollouts past ``max_finished_kept`` (lock held)."""
        keep = self.config.max_finished_kept
        if keep is None:
            return
        finished = [s for s in self.table.open.values() if s.finished]
        for state in finished[: max(0, len(finished) - keep)]:
            self.table.forget_finished(state)


class RolloutViews:
    """What the open rollouts hold, read under the registry's lock."""

    def __init__(self, table: RolloutTable) -> None:
        self.table = table

    def counts(self) -> tuple[dict[str, int], int]:
        """The table's counters and how many rollouts are open and unfinished."""
        with self.table.cond:
            counts = dict(self.table.counts)
            open_now = sum(not s.finished for s in self.table.open.values())
        return counts, open_now

    def rollout(self, rollout_id: str, *, secret: str | None = None) -> dict[str, Any]:
        """Summary and records of one open rollout (404 if unknown, 409 if closed, 403
        when ``secret`` is not its secret; ``None``: in-process, trusted)."""
        with self.table.cond:
            state = self.table.get(rollout_id)
            check_secret(state, secret)
            return {**state.summary(), "records": [record_to_json(r) for r in state.records]}

    def rollouts(self) -> list[dict[str, Any]]:
        """Summaries of the open rollouts, in the order they were opened."""
        with self.table.cond:
            return [state.summary() for state in self.table.open.values()]

    def records(self) -> list[TurnRecord]:
        """All turn records so far (unfinished rollouts included)."""
        with self.table.cond:
            return [r for s in self.table.open.values() for r in s.records]

    def finished_records(self) -> list[TurnRecord]:
        """The records of finished rollouts (ready for ``TurnTable.from_records``)."""
        with self.table.cond:
            return [r for s in self.table.open.values() if s.finished for r in s.records]

    def pop_finished_rollouts(self) -> list[FinishedRollout]:
        """The finished rollouts, which are then forgotten (their ids stay used)."""
        with self.table.cond:
            done = [s for s in self.table.open.values() if s.finished]
            for state in done:
                self.table.forget_finished(state)
            return [
                FinishedRollout(
                    rollout_id=s.rollout_id,
                    task_id=s.task_id,
                    reward=float(s.reward if s.reward is not None else 0.0),
                    records=tuple(s.records),
                    policy_versions=s.policy_versions(),
                    context_rebuilds=s.rebuilds,
                    truncated=s.truncated,
                )
                for s in done
            ]

    def pop_finished(self) -> list[TurnRecord]:
        """Records of finished rollouts, which are then forgotten (frees memory in
        long runs); :meth:`pop_finished_rollouts` keeps them per rollout."""
        return [r for rollout in self.pop_finished_rollouts() for r in rollout.records]
