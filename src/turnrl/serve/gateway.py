"""The gateway core: per-rollout token contexts, sampling, turn records, weight swaps.

:class:`Gateway` turns validated chat requests into policy samples and records
each call as a turn record (``docs/turn-records.md``). It knows nothing of HTTP
(:mod:`turnrl.serve.app` wraps it), so a trainer drives it in-process: open
rollouts, collect finished ones (:class:`~turnrl.serve.rollouts.FinishedRollout`),
close timed-out ones, swap weights between steps (``docs/gateway.md``).

Exact tokens. Each role of a rollout (the ``model`` name of its requests) keeps
the token context of its last turn: ``prompt_ids + response_ids`` (plus the
end-of-turn id when the response was cut at ``max_tokens``, as the rollout
runner does). A request *extends* the last turn when its messages are the
previous request's messages, then the assistant message the gateway returned
(compared by role, text and tool calls, not ids), then new messages. Then:

* one new message: the context is the kept ids plus
  ``policy.encode_observation(message)``, so no sampled token is re-tokenised;
* several new messages: the whole conversation (with the sampled text for the
  assistant turn) is encoded with ``encode_initial``; if that starts with the
  kept ids the turn is exact, otherwise it is a rebuild.

Any other request (first call excepted) rewrote history: the context is
``encode_initial`` of the full messages and the record says
``context_rebuilt: true`` (counted in :attr:`Gateway.context_rebuilds`).

Tools. A conversation's tool set is fixed by its first request with ``tools``
and kept for the whole rollout: a later request without ``tools`` (autogen's
reflection call) is rendered with the same tool lines and call blocks, so it
still extends the context; it and a request with ``tool_choice: "none"`` only
do not have new calls parsed. A different non-empty tool set replaces it (the
prompt changes, so that turn is a rebuild).

Retries. A request equal to the role's last one (an OpenAI client retrying
after a timeout) gets that call's result again, waiting for it when it is
still being sampled, and is recorded once. Any other request on a rollout that
is answering one waits for it (a rollout answers one request at a time).

Records. Turn ``k`` of rollout ``r`` has ``traj_id=r``, ``turn=k``, ``role``
(the request's ``model``), the messages the policy saw (``prompt``),
``prompt_ids``, ``response``, ``response_ids``, ``logprobs`` (under the sampling
temperature, recorded as ``temperature``), ``policy_version``, ``reward=0`` and
``done=false`` until :meth:`Gateway.reward` puts the final reward on the last
turn. Extra fields: ``finish_reason``, ``stop_reason``, ``tool_call``,
``context_rebuilt``. Greedy turns (``temperature=0``) are recorded with
``train: false`` and log-probs 0 (the greedy choice has probability 1): no
sampling distribution exists for a PPO ratio, so trainers leave them out.

Concurrency. Rollout state lives in a :class:`~turnrl.serve.rollouts.RolloutTable`
under one condition variable. Tokenizer calls share a lock with the sampler
(fast tokenizers are not safe to mutate from several threads, and weights
change only under it); sampling goes through a
:class:`~turnrl.serve.batcher.MicroBatcher`.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from turnrl.envs.tools import get_format
from turnrl.records import record_to_json
from turnrl.serve.batcher import MicroBatcher, Sampled
from turnrl.serve.errors import GatewayError, bad_request
from turnrl.serve.protocol import ChatRequest, ToolSpec, is_finite_number, tools_key
from turnrl.serve.recordsfile import RecordsFile
from turnrl.serve.responses import completion_body, logprobs_content, tool_call_id
from turnrl.serve.rollouts import (
    ClosedRollout,
    Conversation,
    FinishedRollout,
    Rollout,
    RolloutTable,
    check_secret,
)
from turnrl.serve.toolcalls import parse_reply, to_policy_message, to_policy_messages
from turnrl.types import Message, Policy, TurnRecord

T = TypeVar("T")

logger = logging.getLogger("turnrl.serve")

MAX_ID_LENGTH = 256
"""Longest rollout or task id accepted."""

CHARS_PER_TOKEN_BOUND = 16
"""Default request size bound: at most this many characters per context position.
Real text averages about 4 characters per token, so a request over the bound
cannot fit the context in practice; refusing it before tokenising keeps one
huge body from costing seconds and gigabytes (``max_request_chars`` overrides)."""

JSON_BYTES_PER_CHAR = 12
"""Most bytes one character of text takes in a JSON body (an astral character written
as a surrogate pair of ``\\u`` escapes)."""

BODY_SLACK_BYTES = 2**20
"""Room in a body for what is not text: JSON structure, ids, ignored fields."""

MESSAGE_OVERHEAD_BYTES = 64
"""JSON structure of one message (``{"role": "user", "content": ""}`` and commas)."""

SWEEP_INTERVAL_S = 1.0
"""Requests close timed-out rollouts at most this often (or a quarter of the timeout)."""

ROLLOUT_SECRET_BYTES = 24
"""Random bytes in a rollout's secret (``secrets.token_urlsafe``: 32 characters)."""

_PROBE: list[Message] = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "Compute 12*13."},
]


@dataclass(frozen=True)
class GatewayConfig:
    """How the gateway samples, renders tools, bounds requests and stores records."""

    model_name: str = "turnrl-policy"
    """Model id in ``/v1/models`` and in responses (requests may name any model;
    the name a request gives becomes its record's ``role``)."""
    tool_format: str = "tags"
    """Tool-call text format the policy writes: ``"tags"`` or ``"hermes"``."""
    tools_in_prompt: bool = True
    """Describe the conversation's tools in the system prompt; turn off when the
    agent's own system prompt already explains them (e.g. a policy trained on
    turnrl's calculator prompt)."""
    default_max_tokens: int = 256
    """Response budget when a request gives no ``max_tokens``."""
    max_tokens_limit: int = 4096
    """Largest ``max_tokens`` a request may ask for (more is a 400)."""
    default_temperature: float = 1.0
    """Sampling temperature when a request gives none."""
    batch_window_s: float = 0.005
    """How long the micro-batcher gathers concurrent requests."""
    max_batch: int = 64
    """Most requests sampled in one ``policy.sample`` call."""
    records_path: str | None = None
    """Append each finished trajectory's records to this JSONL file."""
    rollout_timeout_s: float | None = None
    """Close a rollout that has no reward this long after it was opened (its first
    call, or ``open_rollout``): dropped and counted as ``timed_out``. The agent loop
    passes its ``agent.timeout_s``; ``None`` keeps rollouts until their reward."""
    max_request_chars: int | None = None
    """Refuse requests with more characters of text (before tokenising them);
    default ``CHARS_PER_TOKEN_BOUND`` x the model's context, none if that is unknown."""
    max_finished_kept: int | None = None
    """Forget the oldest finished rollouts past this many (``turnrl serve``: their
    records are in ``records_path``); ``None`` keeps them until collected."""
    idle_timeout_s: float | None = None
    """Close a rollout with no request for this long (and none in flight): an
    abandoned rollout's memory is freed (counted as ``idle_closed``). ``turnrl
    serve`` sets 600 s; ``None``: never."""
    auto_open: bool = True
    """A call naming an unknown rollout id starts that rollout (``turnrl serve``,
    where clients choose ids). The agent loop sets ``False``: only rollouts it
    opened with :meth:`Gateway.open_rollout` are served, any other id is a 404."""


def check_id(value: Any, what: str) -> str:
    """A rollout/task id: a non-empty string of at most 256 printable, non-space characters."""
    if (
        not isinstance(value, str)
        or not value
        or len(value) > MAX_ID_LENGTH
        or not value.isprintable()
        or any(c.isspace() for c in value)
    ):
        raise bad_request(
            f"{what} must be 1 to {MAX_ID_LENGTH} printable characters without spaces, "
            f"got {value!r}",
            what,
        )
    return value


def check_reward(value: Any, param: str = "reward") -> float:
    """A finite number (bools and huge integers are refused), as a float."""
    if not is_finite_number(value):
        raise bad_request(f"{param} must be a finite number, got {value!r}", param)
    return float(value)


class Gateway:
    """Serves a policy to agent programs and records their calls as turn records."""

    def __init__(
        self, policy: Policy, config: GatewayConfig | None = None, *, policy_version: int = 0
    ) -> None:
        self.config = config if config is not None else GatewayConfig()
        get_format(self.config.tool_format)  # unknown formats fail here, not per request
        if not 1 <= self.config.default_max_tokens <= self.config.max_tokens_limit:
            raise ValueError("need 1 <= default_max_tokens <= max_tokens_limit")
        timeout, idle = self.config.rollout_timeout_s, self.config.idle_timeout_s
        if timeout is not None and not timeout > 0:
            raise ValueError(f"rollout_timeout_s must be > 0, got {timeout}")
        if idle is not None and not idle > 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {idle}")
        self.context_rebuilds = 0
        """Turns whose context had to be re-encoded from text (history rewritten)."""
        self._policy_lock = threading.RLock()
        """Held while sampling, tokenising and changing weights (re-entrant:
        ``load_weights`` runs inside ``updating``)."""
        self._rollouts = RolloutTable(timeout_s=timeout, idle_s=idle)
        self._next_sweep = 0.0
        self._closing = False
        self._records_file = (
            RecordsFile(self.config.records_path) if self.config.records_path else None
        )
        self._batcher = MicroBatcher(
            policy,
            window_s=self.config.batch_window_s,
            max_batch=self.config.max_batch,
            lock=self._policy_lock,
            version=policy_version,
        )

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop the sampling worker (requests after this fail), wake waiting requests,
        and write what the records file still owes (see :class:`RecordsFile`)."""
        with self._rollouts.cond:
            self._closing = True
            self._rollouts.cond.notify_all()
        self._batcher.close()
        if self._records_file is not None:
            self._records_file.close()

    def __enter__(self) -> Gateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def batch_stats(self) -> dict[str, int]:
        """How requests were batched: ``calls``, ``requests``, ``largest``."""
        stats = self._batcher.stats
        return {"calls": stats.calls, "requests": stats.requests, "largest": stats.largest}

    @property
    def stats(self) -> dict[str, Any]:
        """Counters for monitoring (``GET /health`` shows them)."""
        with self._rollouts.cond:
            counts = dict(self._rollouts.counts)
            open_now = sum(not s.finished for s in self._rollouts.open.values())
        records = self._records_file
        return {
            "policy_version": self.policy_version,
            "open": open_now,
            **counts,
            "context_rebuilds": self.context_rebuilds,
            "unwritten_rollouts": records.pending if records is not None else 0,
            "records_error": records.last_error if records is not None else None,
            "batching": self.batch_stats,
        }

    # -------------------------------------------------------------------- weights
    @property
    def policy(self) -> Policy:
        """The policy being served."""
        return self._batcher.policy

    @property
    def policy_version(self) -> int:
        """Version of the weights being served (recorded on every turn)."""
        return self._batcher.version

    @contextmanager
    def updating(self, version: int) -> Iterator[Policy]:
        """Hold sampling while the caller changes the served policy in place.

        Waits for the batch being sampled, yields the policy, and serves
        ``version`` from then on (also if the block raises: the weights may have
        changed). Requests arriving meanwhile wait; none is sampled mid-update.
        """
        _check_version(version)
        with self._policy_lock:
            try:
                yield self._batcher.policy
            finally:
                self._batcher.version = version

    def load_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Load ``state_dict`` into the served policy between two batches."""
        policy = self.policy
        load = getattr(policy, "load_state_dict", None)
        if load is None:
            raise TypeError(f"{type(policy).__name__} has no load_state_dict; use swap_policy")
        with self.updating(version):
            load(state_dict)

    def swap_policy(self, policy: Policy, version: int) -> None:
        """Serve another policy object from the next batch on.

        It must tokenise like the current one (same end-of-turn id and the same
        ids for a probe conversation), because open rollouts keep token contexts.
        """
        _check_version(version)
        with self._policy_lock:
            old = self._batcher.policy
            same = policy.eos_token_id == old.eos_token_id and policy.encode_initial(
                _PROBE
            ) == old.encode_initial(_PROBE)
            if not same:
                raise ValueError(
                    "the new policy tokenises differently from the served one; open rollouts "
                    "keep token contexts, so it cannot be swapped in (start a new gateway)"
                )
            self._batcher.policy = policy
            self._batcher.version = version

    # ------------------------------------------------------------------ rollouts
    def open_rollout(self, rollout_id: str, task_id: str | None = None) -> str:
        """Register a rollout before its first call: fixes its task id, starts its
        timeout clock (so an agent that never calls is closed and counted too), and
        returns its secret (``secrets``-made): every HTTP call and reward naming the
        rollout must carry it (:class:`~turnrl.serve.server.RolloutEndpoint` puts it
        in the URLs), so no other agent or process can add turns or a reward to it."""
        check_id(rollout_id, "rollout_id")
        if task_id is not None:
            check_id(task_id, "task_id")
        secret = secrets.token_urlsafe(ROLLOUT_SECRET_BYTES)
        with self._rollouts.cond:
            if rollout_id in self._rollouts.open:
                raise ValueError(f"rollout {rollout_id!r} is already open")
            self._rollouts.get_or_create(rollout_id, task_id, pinned=True, secret=secret)
        return secret

    def note_refusal(self, rollout_id: str, secret: str | None, error: GatewayError) -> None:
        """Remember that a call on ``rollout_id`` was refused (kept for the rollout's
        failure report; ignored for unknown rollouts and wrong secrets)."""
        where = f" ({error.param})" if error.param else ""
        with self._rollouts.cond:
            self._rollouts.note_refusal(
                rollout_id, secret, f"HTTP {error.status}{where}: {error.message}"
            )

    def problems(self, rollout_id: str) -> tuple[list[str], list[float]]:
        """The refused calls (the gateway's answers) and refused second rewards of an
        open rollout, oldest first (the last few of each)."""
        with self._rollouts.cond:
            return self._rollouts.problems(rollout_id)

    def discard(self, rollout_id: str, reason: str) -> ClosedRollout | None:
        """Drop a rollout (an agent that failed); counted as ``discarded``. ``None``
        if it is not open. A request still being answered is answered, not recorded."""
        with self._rollouts.cond:
            state = self._rollouts.open.get(rollout_id)
            if state is None:
                return None
            closed = self._rollouts.close(state, f"discarded: {reason}")
        logger.warning("rollout %r discarded (%s)", rollout_id, reason)
        return closed

    def close_expired(self, now: float | None = None) -> list[ClosedRollout]:
        """Close the rollouts without a reward ``rollout_timeout_s`` after they were
        opened (counted as ``timed_out``) or idle for ``idle_timeout_s`` (counted as
        ``idle_closed``); returns those closed now. Finished rollouts are kept."""
        with self._rollouts.cond:
            table = self._rollouts
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

    def _sweep(self) -> None:
        """Close expired rollouts (not more often than ``SWEEP_INTERVAL_S``, or a quarter
        of the shortest timeout)."""
        now = self._rollouts.clock()
        limits = [
            t for t in (self.config.rollout_timeout_s, self.config.idle_timeout_s) if t is not None
        ]
        if not limits or now < self._next_sweep:
            return
        self._next_sweep = now + min(SWEEP_INTERVAL_S, min(limits) / 4)
        self.close_expired(now)

    def pop_closed(self) -> list[ClosedRollout]:
        """Rollouts closed without a reward (timeouts, discards) since the last call."""
        with self._rollouts.cond:
            out = list(self._rollouts.closed_log)
            self._rollouts.closed_log.clear()
            return out

    # ---------------------------------------------------------------- completions
    def complete(
        self,
        request: ChatRequest,
        rollout_id: str,
        task_id: str | None = None,
        *,
        secret: str | None = None,
    ) -> dict[str, Any]:
        """Sample a reply for ``request`` in rollout ``rollout_id``; record the turn.

        Returns the OpenAI ``chat.completion`` body. Raises ``GatewayError`` for
        requests the gateway refuses. ``secret`` is what the HTTP request carried
        (``""`` when nothing); ``None`` is an in-process caller, which is trusted.
        """
        self._check_size(request)
        check_id(rollout_id, "rollout_id")
        if task_id is not None:
            check_id(task_id, "task_id")
        self._sweep()
        claimed = self._claim(request, rollout_id, task_id, secret)
        if isinstance(claimed, dict):
            return claimed  # a retry: the result of the call it repeats
        state, conversation = claimed
        try:
            return self._complete(state, conversation, request)
        finally:
            with self._rollouts.cond:
                state.in_flight = None
                state.last_active = self._rollouts.clock()
                if not state.records and not state.pinned and state.closed is None:
                    self._rollouts.open.pop(state.rollout_id, None)  # a failed first call
                self._rollouts.cond.notify_all()

    @property
    def max_request_chars(self) -> int | None:
        """Most characters of text a request may hold (``None``: no bound)."""
        if self.config.max_request_chars is not None:
            return self.config.max_request_chars
        limit = self.policy.max_context
        return None if limit is None else CHARS_PER_TOKEN_BOUND * limit

    @property
    def max_body_bytes(self) -> int | None:
        """Largest JSON body that can hold a request within :attr:`max_request_chars`
        (the HTTP app refuses larger bodies with 413 while reading them, so a huge
        body never sits in memory whole)."""
        chars = self.max_request_chars
        if chars is None:
            return None
        messages = self.policy.max_context or 0
        return JSON_BYTES_PER_CHAR * chars + MESSAGE_OVERHEAD_BYTES * messages + BODY_SLACK_BYTES

    def _check_size(self, request: ChatRequest) -> None:
        """400 for requests that cannot fit the context, before any tokenising."""
        limit = self.policy.max_context
        chars = self.max_request_chars
        if limit is not None and len(request.messages) >= limit:
            raise bad_request(
                f"{len(request.messages)} messages cannot fit a context of {limit} positions",
                "messages",
                code="context_length_exceeded",
            )
        size = request.characters()
        if chars is not None and size > chars:
            raise bad_request(
                f"the request has {size} characters of text; this gateway accepts at most "
                f"{chars} (the model's context is {limit} positions)",
                "messages",
                code="context_length_exceeded",
            )

    def _claim(
        self, request: ChatRequest, rollout_id: str, task_id: str | None, secret: str | None
    ) -> tuple[Rollout, Conversation] | dict[str, Any]:
        """Take the rollout for ``request``: waits while it answers another request;
        returns the stored result instead when ``request`` repeats the role's last."""
        role = request.role
        table = self._rollouts

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
            if task_id is not None:
                self._set_task(state, task_id)
            state.in_flight = (role, request)
            return state, conversation or Conversation()

    def check_access(self, rollout_id: str, secret: str | None) -> None:
        """Raise what a call naming ``rollout_id`` with ``secret`` would get before any
        work (subclasses that do work before :meth:`complete` call this first)."""
        check_id(rollout_id, "rollout_id")
        with self._rollouts.cond:
            if rollout_id in self._rollouts.open or not self.config.auto_open:
                self._rollouts.lookup(rollout_id, None, secret, create=False)

    def _wait_idle(self, lookup: Callable[[], Rollout]) -> Rollout:
        """The rollout ``lookup`` finds (again after every wake-up), once it answers no
        request. The caller holds the lock; waiting releases it."""
        while True:
            if self._closing:
                raise GatewayError(503, "the gateway is shutting down")
            state = lookup()
            if state.in_flight is None:
                return state
            self._rollouts.cond.wait()

    @staticmethod
    def _set_task(state: Rollout, task_id: str) -> None:
        """Fix the rollout's task id (once; a trajectory belongs to one task)."""
        if state.task_id_explicit and task_id != state.task_id:
            raise bad_request(
                f"rollout {state.rollout_id!r} belongs to task {state.task_id!r}, not {task_id!r}",
                "task_id",
            )
        state.task_id, state.task_id_explicit = task_id, True
        state.records = [dataclasses.replace(r, task_id=task_id) for r in state.records]

    def _policy_call(self, fn: Callable[..., T], *args: Any) -> T:
        """Call a tokenizer-side policy method under the policy lock."""
        with self._policy_lock:
            return fn(*args)

    def _encode_initial(self, messages: list[Message]) -> list[int]:
        try:
            return self._policy_call(self.policy.encode_initial, messages)
        except Exception as exc:
            raise bad_request(
                f"the policy cannot encode these messages: {exc}", "messages"
            ) from exc

    def _tools_key(self, tools: tuple[ToolSpec, ...]) -> str:
        """What of the tools shapes the prompt: nothing unless they are described in it."""
        return tools_key(tools) if self.config.tools_in_prompt else ""

    def _context(
        self, conv: Conversation, request: ChatRequest, tools: tuple[ToolSpec, ...]
    ) -> tuple[list[Message], list[int], bool]:
        """The turn's prompt messages, prompt ids, and whether they were rebuilt."""
        fmt = self.config.tool_format
        keys = tuple(m.key() for m in request.messages)
        n = len(conv.keys)
        extends = (
            conv.reply_key is not None
            and self._tools_key(tools) == self._tools_key(conv.tools)
            and len(keys) > n + 1
            and keys[:n] == conv.keys
            and keys[n] == conv.reply_key
        )
        if not extends:
            prompt = to_policy_messages(
                request.messages, tools, fmt, tools_in_prompt=self.config.tools_in_prompt
            )
            return prompt, self._encode_initial(prompt), conv.reply_key is not None
        new = [to_policy_message(m, tools, fmt) for m in request.messages[n + 1 :]]
        prompt = [*conv.prompt, {"role": "assistant", "content": conv.response}, *new]
        if len(new) == 1:
            try:
                tail = self._policy_call(self.policy.encode_observation, new[0])
            except Exception as exc:
                raise bad_request(
                    f"the policy cannot encode message {len(keys) - 1}: {exc}", "messages"
                ) from exc
            return prompt, conv.context + tail, False
        ids = self._encode_initial(prompt)
        return prompt, ids, ids[: len(conv.context)] != conv.context

    def _budget(self, request: ChatRequest, prompt_ids: list[int]) -> tuple[int, float]:
        """``max_new_tokens`` and temperature; 400 if the context leaves no room."""
        max_tokens = request.max_tokens or self.config.default_max_tokens
        if max_tokens > self.config.max_tokens_limit:
            raise bad_request(
                f"max_tokens={max_tokens} exceeds this gateway's limit "
                f"({self.config.max_tokens_limit})",
                "max_tokens",
            )
        limit = self.policy.max_context
        if limit is not None and len(prompt_ids) >= limit:
            raise bad_request(
                f"the conversation is {len(prompt_ids)} tokens; the model accepts at most "
                f"{limit} positions including the response",
                "messages",
                code="context_length_exceeded",
            )
        temperature = request.temperature
        return max_tokens, self.config.default_temperature if temperature is None else temperature

    def _complete(self, state: Rollout, conv: Conversation, request: ChatRequest) -> dict[str, Any]:
        tools = request.tools or conv.tools
        parse_tools = tools if request.tools and request.tool_choice != "none" else ()
        prompt, prompt_ids, rebuilt = self._context(conv, request, tools)
        max_tokens, temperature = self._budget(request, prompt_ids)
        sampled = self._batcher.submit(
            prompt_ids, max_new_tokens=max_tokens, temperature=temperature, seed=request.seed
        )
        sample = sampled.sample
        turn = len(state.records)
        reply = parse_reply(
            sample.text, parse_tools, self.config.tool_format, tool_call_id(state.rollout_id, turn)
        )
        if reply.tool_calls:
            finish = "tool_calls"
        else:
            finish = "length" if sample.stop_reason == "length" else "stop"
        record = dataclasses.replace(
            self._record(state, request.role, turn, prompt, prompt_ids, sampled, temperature),
            finish_reason=finish,
            tool_call=bool(reply.tool_calls),
            context_rebuilt=rebuilt,
        )
        logprobs = self._logprobs(sampled) if request.logprobs else None
        body = completion_body(
            rollout_id=state.rollout_id,
            task_id=state.task_id,
            turn=turn,
            model=request.model,
            reply=reply,
            finish_reason=finish,
            prompt_ids=prompt_ids,
            response_ids=list(sample.response_ids),
            logprobs=logprobs,
            context_rebuilt=rebuilt,
            policy_version=sampled.policy_version,
        )
        context = prompt_ids + list(sample.response_ids)
        if sample.stop_reason != "stop":
            context.append(self.policy.eos_token_id)
        with self._rollouts.cond:
            if state.closed is not None:
                return body  # discarded or timed out meanwhile: answered, not recorded
            state.records.append(record)
            conv.keys = tuple(m.key() for m in request.messages)
            conv.tools = tools
            conv.reply_key = reply.as_chat_message().key()
            conv.prompt, conv.response, conv.context = prompt, sample.text, context
            conv.last_request, conv.last_result = request, body
            state.conversations[request.role] = conv
            if rebuilt:
                state.rebuilds += 1
                self.context_rebuilds += 1
        return body

    @staticmethod
    def _record(
        state: Rollout,
        role: str,
        turn: int,
        prompt: list[Message],
        prompt_ids: list[int],
        sampled: Sampled,
        temperature: float,
    ) -> TurnRecord:
        sample = sampled.sample
        greedy = temperature == 0
        return TurnRecord(
            task_id=state.task_id,
            traj_id=state.rollout_id,
            turn=turn,
            role=role,
            prompt=tuple(copy.deepcopy(prompt)),
            response=sample.text,
            prompt_ids=tuple(prompt_ids),
            response_ids=tuple(sample.response_ids),
            # Greedy: the choice had probability 1; there is no distribution to train on.
            logprobs=tuple(0.0 if greedy else float(x) for x in sample.logprobs),
            stop_reason=sample.stop_reason,
            temperature=float(temperature),
            policy_version=sampled.policy_version,
            train=not greedy,
        )

    def _logprobs(self, sampled: Sampled) -> dict[str, Any]:
        """OpenAI logprobs of the response, without a final end-of-turn token (for
        greedy turns, under the untempered distribution, as the policy reports them)."""
        sample = sampled.sample
        ids, logprobs = list(sample.response_ids), list(sample.logprobs)
        if sample.stop_reason == "stop" and ids:
            ids, logprobs = ids[:-1], logprobs[:-1]
        with self._policy_lock:
            return logprobs_content(ids, logprobs, lambda i: self.policy.decode([i]))

    # --------------------------------------------------------------------- reward
    def reward(
        self,
        rollout_id: str,
        reward: Any,
        task_id: str | None = None,
        *,
        secret: str | None = None,
    ) -> dict[str, Any]:
        """Put the final ``reward`` on the rollout's last turn and finish it.

        ``task_id`` (optional) names the task if the calls did not; ``secret`` is
        the one the HTTP request carried (``None``: in-process, trusted). Waits for a
        request still being answered. Posting the same reward again answers as
        the first time; a different one is a 409, and remembered
        (:meth:`problems`: the agent loop fails such a rollout). The finished trajectory is
        appended to ``records_path`` when configured (``records_written`` says
        whether it got there; if not it is kept and retried, see
        :class:`~turnrl.serve.recordsfile.RecordsFile`). Unknown rollouts are a
        404, closed ones a 409.
        """
        value = check_reward(reward)
        if task_id is not None:
            check_id(task_id, "task_id")
        self._sweep()
        table = self._rollouts
        with table.cond:
            tomb = None if rollout_id in table.open else table.tombstone(rollout_id)
            if tomb is not None and tomb.reason == "finished" and tomb.reward == value:
                return {"rollout_id": rollout_id, "finished": True, "reward": value}
            state = self._wait_idle(lambda: table.get(rollout_id))  # 409 closed, 404 unknown
            check_secret(state, secret)
            if state.finished:
                if state.reward == value:
                    return {**state.summary(), "reward": value}
                state.refused_rewards.append(value)
                raise GatewayError(
                    409,
                    f"rollout {rollout_id!r} already has reward {state.reward}, not {value}",
                    code="rollout_finished",
                )
            if task_id is not None:
                self._set_task(state, task_id)
            if state.records:
                state.records[-1] = dataclasses.replace(state.records[-1], reward=value, done=True)
            state.finished, state.reward = True, value
            table.counts["finished"] += 1
            finished = [record_to_json(r) for r in state.records]
            summary = {**state.summary(), "reward": value}
            self._forget_old_finished()
        if self._records_file is not None:
            summary["records_written"] = self._records_file.submit(finished)
        return summary

    def _forget_old_finished(self) -> None:
        """Drop the oldest finished rollouts past ``max_finished_kept`` (lock held)."""
        keep = self.config.max_finished_kept
        if keep is None:
            return
        finished = [s for s in self._rollouts.open.values() if s.finished]
        for state in finished[: max(0, len(finished) - keep)]:
            self._rollouts.forget_finished(state)

    def flush_records(self) -> int:
        """Retry writing trajectories a failed append left behind; how many remain."""
        return self._records_file.flush() if self._records_file is not None else 0

    # -------------------------------------------------------------------- queries
    def rollout(self, rollout_id: str, *, secret: str | None = None) -> dict[str, Any]:
        """Summary and records of one open rollout (404 if unknown, 409 if closed, 403
        when ``secret`` is not its secret; ``None``: in-process, trusted)."""
        with self._rollouts.cond:
            state = self._rollouts.get(rollout_id)
            check_secret(state, secret)
            return {**state.summary(), "records": [record_to_json(r) for r in state.records]}

    def rollouts(self) -> list[dict[str, Any]]:
        """Summaries of the open rollouts, in the order they were opened."""
        with self._rollouts.cond:
            return [state.summary() for state in self._rollouts.open.values()]

    def records(self) -> list[TurnRecord]:
        """All turn records so far (unfinished rollouts included)."""
        with self._rollouts.cond:
            return [r for s in self._rollouts.open.values() for r in s.records]

    def finished_records(self) -> list[TurnRecord]:
        """The records of finished rollouts (ready for ``TurnTable.from_records``)."""
        with self._rollouts.cond:
            return [r for s in self._rollouts.open.values() if s.finished for r in s.records]

    def pop_finished_rollouts(self) -> list[FinishedRollout]:
        """The finished rollouts, which are then forgotten (their ids stay used)."""
        with self._rollouts.cond:
            done = [s for s in self._rollouts.open.values() if s.finished]
            for state in done:
                self._rollouts.forget_finished(state)
            return [
                FinishedRollout(
                    rollout_id=s.rollout_id,
                    task_id=s.task_id,
                    reward=float(s.reward if s.reward is not None else 0.0),
                    records=tuple(s.records),
                    policy_versions=s.policy_versions(),
                    context_rebuilds=s.rebuilds,
                )
                for s in done
            ]

    def pop_finished(self) -> list[TurnRecord]:
        """Records of finished rollouts, which are then forgotten (frees memory in
        long runs); :meth:`pop_finished_rollouts` keeps them per rollout."""
        return [r for rollout in self.pop_finished_rollouts() for r in rollout.records]


def _check_version(version: Any) -> None:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"policy version must be an integer >= 0, got {version!r}")
