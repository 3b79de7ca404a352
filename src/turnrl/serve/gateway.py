"""The gateway core: per-rollout token contexts, sampling, turn records, weight swaps.

:class:`Gateway` turns validated chat requests into policy samples and records
each call as a turn record (``docs/turn-records.md``). It knows nothing of HTTP
(:mod:`turnrl.serve.app` wraps it), so a trainer drives it in-process: open
rollouts, collect finished ones (:class:`~turnrl.serve.rollouts.FinishedRollout`),
close timed-out ones, swap weights between steps (``docs/gateway.md``).

It is the one public face of parts that each do one job; a reader follows a call
here (:meth:`Gateway.complete`, :meth:`Gateway.reward`) and into them:

* :mod:`turnrl.serve.registry`: the rollout registry (open, claim, retries,
  finish, timeouts, discards) and the read side
  (:class:`~turnrl.serve.registry.RolloutViews`);
* :mod:`turnrl.serve.limits`: request limits (ids, rewards, size before
  tokenising, the response budget);
* :mod:`turnrl.serve.conversation`: conversation extension, exact token
  contexts and when a context is rebuilt;
* :mod:`turnrl.serve.turnrecords`: building the turn record of a call;
* :mod:`turnrl.serve.weights`: the served policy, its lock, weight swaps;
* :mod:`turnrl.serve.guard` (in the HTTP app): the key and the browser guard.

Tools. A conversation's tool set is fixed by its first request with ``tools``
and kept for the whole rollout: a later request without ``tools`` (autogen's
reflection call) is rendered with the same tool lines and call blocks, so it
still extends the context; it and a request with ``tool_choice: "none"`` only
do not have new calls parsed. A different non-empty tool set replaces it (the
prompt changes, so that turn is a rebuild).

Forced calls. ``tool_choice`` ``"required"`` or a named function: the forced start
of the call is appended to the context (:meth:`ContextBuilder.forced
<turnrl.serve.conversation.ContextBuilder.forced>`), the policy samples the rest,
and the reply is parsed from the forced text plus the sampled text. The record's
``prompt_ids`` end with the forced ids, ``response_ids``/``logprobs`` are the sampled
tokens only (so the update, which trains response tokens, never trains a forced
one), and ``forced`` holds the forced text.

Rebuilt contexts are recorded as ``context_rebuilt: true`` and counted in
``Gateway.registry.context_rebuilds``.

Context cap. With ``GatewayConfig.max_context_tokens`` set, a call whose prompt plus
``max_tokens`` exceed it is not sampled: it gets the 400 ``context_length_exceeded``
(:class:`~turnrl.serve.limits.ContextCapExceeded`) and its rollout ends truncated
(``truncated: "context"``; later calls get the same 400; the reward may be posted).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from turnrl.envs.tools import get_format
from turnrl.serve.batcher import Sampled
from turnrl.serve.choices import choice_seeds, continue_choice, first_record
from turnrl.serve.config import GatewayConfig
from turnrl.serve.conversation import ContextBuilder, next_context, remember_turn
from turnrl.serve.limits import (
    BODY_SLACK_BYTES,
    CHARS_PER_TOKEN_BOUND,
    JSON_BYTES_PER_CHAR,
    MAX_ID_LENGTH,
    MESSAGE_OVERHEAD_BYTES,
    ContextCapExceeded,
    budget,
    check_id,
    check_reward,
    check_size,
    max_body_bytes,
    max_request_chars,
)
from turnrl.serve.protocol import ChatRequest, ToolSpec
from turnrl.serve.recordsfile import RecordsFile
from turnrl.serve.registry import RolloutRegistry, RolloutViews
from turnrl.serve.responses import choice_body, completion_body, tool_call_id
from turnrl.serve.rollouts import (
    TRUNCATED_AT_CONTEXT,
    ClosedRollout,
    Conversation,
    Offered,
    Rollout,
)
from turnrl.serve.stops import cut_at_stop
from turnrl.serve.toolcalls import parse_reply
from turnrl.serve.turnrecords import build_record, finish_reason, response_logprobs
from turnrl.serve.weights import ServedPolicy
from turnrl.types import Message, Policy, TurnRecord

__all__ = [
    "BODY_SLACK_BYTES",
    "CHARS_PER_TOKEN_BOUND",
    "JSON_BYTES_PER_CHAR",
    "MAX_ID_LENGTH",
    "MESSAGE_OVERHEAD_BYTES",
    "Gateway",
    "GatewayConfig",
    "check_id",
    "check_reward",
]


@dataclass(frozen=True)
class _Call:
    """What every choice of one claimed call shares."""

    state: Rollout
    request: ChatRequest
    tools: tuple[ToolSpec, ...]
    prompt: list[Message]
    prompt_ids: list[int]
    """The context sampled from: the prompt's ids, then the forced ids (if any)."""
    forced: str
    """The forced start of the reply ("" when no call is forced)."""
    temperature: float
    turn: int
    rebuilt: bool


@dataclass(frozen=True)
class _Choice:
    """One choice of a call: its record, its ``choices[i]`` entry, what it offers next."""

    record: TurnRecord
    body: dict[str, Any]
    offered: Offered


class Gateway:
    """Serves a policy to agent programs and records their calls as turn records.

    The methods here are what takes a call through several parts (:meth:`complete`,
    :meth:`reward`, :attr:`stats`) and the few a trainer calls every step (open a
    rollout, discard one, swap weights). The rest is asked of the part that does it,
    a public attribute:

    * ``registry`` (:class:`~turnrl.serve.registry.RolloutRegistry`): refusals and
      problems of a rollout, access checks, timeouts (``close_expired``,
      ``pop_closed``), ``context_rebuilds``;
    * ``views`` (:class:`~turnrl.serve.registry.RolloutViews`): what was recorded
      (``rollout``, ``rollouts``, ``records``, ``finished_records``,
      ``pop_finished_rollouts``, ``pop_finished``);
    * ``served`` (:class:`~turnrl.serve.weights.ServedPolicy`): the policy being
      served, its version, ``batch_stats()``.
    """

    def __init__(
        self, policy: Policy, config: GatewayConfig | None = None, *, policy_version: int = 0
    ) -> None:
        self.config = config if config is not None else GatewayConfig()
        get_format(self.config.tool_format)  # unknown formats fail here, not per request
        if not 1 <= self.config.default_max_tokens <= self.config.max_tokens_limit:
            raise ValueError("need 1 <= default_max_tokens <= max_tokens_limit")
        self.registry = RolloutRegistry(self.config)
        self.views = RolloutViews(self.registry.table)
        self._records_file = (
            RecordsFile(self.config.records_path) if self.config.records_path else None
        )
        self.served = ServedPolicy(policy, self.config, policy_version)
        self._contexts = ContextBuilder(self.config, self.served)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop the sampling worker (requests after this fail), wake waiting requests,
        and write what the records file still owes (see :class:`RecordsFile`)."""
        self.registry.shut_down()
        self.served.close()
        if self._records_file is not None:
            self._records_file.close()

    def __enter__(self) -> Gateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def stats(self) -> dict[str, Any]:
        """Counters for monitoring (``GET /health`` shows them)."""
        counts, open_now = self.views.counts()
        records = self._records_file
        return {
            "policy_version": self.policy_version,
            "open": open_now,
            **counts,
            "context_rebuilds": self.registry.context_rebuilds,
            "unwritten_rollouts": records.pending if records is not None else 0,
            "records_error": records.last_error if records is not None else None,
            "batching": self.served.batch_stats(),
        }

    # -------------------------------------------------------------------- weights
    @property
    def policy(self) -> Policy:
        """The policy being served."""
        return self.served.policy

    @property
    def policy_version(self) -> int:
        """Version of the weights being served (recorded on every turn)."""
        return self.served.version

    @contextmanager
    def updating(self, version: int) -> Iterator[Policy]:
        """Hold sampling while the caller changes the served policy in place (see
        :meth:`ServedPolicy.updating <turnrl.serve.weights.ServedPolicy.updating>`)."""
        with self.served.updating(version) as policy:
            yield policy

    def load_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Load ``state_dict`` into the served policy between two batches."""
        self.served.load_weights(state_dict, version)

    def swap_policy(self, policy: Policy, version: int) -> None:
        """Serve another policy object (one that tokenises the same) from the next batch on."""
        self.served.swap_policy(policy, version)

    # ------------------------------------------------------------------ rollouts
    def open_rollout(self, rollout_id: str, task_id: str | None = None) -> str:
        """Register a rollout before its first call: fixes its task id, starts its
        timeout clock (so an agent that never calls is closed and counted too), and
        returns its secret (``secrets``-made): every HTTP call and reward naming the
        rollout must carry it (:class:`~turnrl.serve.server.RolloutEndpoint` puts it
        in the URLs), so no other agent or process can add turns or a reward to it."""
        return self.registry.open(rollout_id, task_id)

    def discard(self, rollout_id: str, reason: str) -> ClosedRollout | None:
        """Drop a rollout (an agent that failed); counted as ``discarded``. ``None``
        if it is not open. A request still being answered is answered, not recorded."""
        return self.registry.discard(rollout_id, reason)

    # ---------------------------------------------------------------- completions
    @property
    def max_request_chars(self) -> int | None:
        """Most characters of text a request may hold (``None``: no bound)."""
        return max_request_chars(self.config, self.policy.max_context)

    @property
    def max_body_bytes(self) -> int | None:
        """Largest JSON body that can hold a request within :attr:`max_request_chars`
        (the HTTP app refuses larger bodies with 413 while reading them, so a huge
        body never sits in memory whole)."""
        return max_body_bytes(self.max_request_chars, self.policy.max_context)

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
        A request equal to the role's last one (a client retrying) gets that call's
        result again and is recorded once; any other request on a rollout that is
        answering one waits for it.
        """
        check_size(request, self.policy.max_context, self.max_request_chars)
        check_id(rollout_id, "rollout_id")
        if task_id is not None:
            check_id(task_id, "task_id")
        self.registry.sweep()
        claimed = self.registry.claim(request, rollout_id, task_id, secret)
        if isinstance(claimed, dict):
            return claimed  # a retry: the result of the call it repeats
        state, conversation = claimed
        try:
            return self._complete(state, conversation, request)
        finally:
            self.registry.release(state)

    def _complete(self, state: Rollout, conv: Conversation, request: ChatRequest) -> dict[str, Any]:
        """Sample and record one claimed call: context, budget, sample, choices, record."""
        tools = request.tools or conv.tools
        prompt, prompt_ids, rebuilt, continued = self._contexts.context(conv, request, tools)
        forced, forced_ids = self._contexts.forced(request)
        prompt_ids = prompt_ids + forced_ids
        try:
            max_tokens, temperature = budget(
                request, prompt_ids, self.config, self.policy.max_context
            )
        except ContextCapExceeded:
            self.registry.end_truncated(state, TRUNCATED_AT_CONTEXT)
            raise
        draws = self.served.sample_choices(
            prompt_ids,
            seeds=choice_seeds(request.seed, request.n),
            max_new_tokens=max_tokens,
            temperature=temperature,
        )
        turn = len(state.records)
        call = _Call(state, request, tools, prompt, prompt_ids, forced, temperature, turn, rebuilt)
        choices = [self._choice(call, i, sampled) for i, sampled in enumerate(draws)]
        record, pending = first_record([c.record for c in choices], turn)
        body = completion_body(
            rollout_id=state.rollout_id,
            task_id=state.task_id,
            turn=turn,
            model=request.model,
            choices=[c.body for c in choices],
            prompt_ids=prompt_ids,
            context_rebuilt=rebuilt,
            policy_version=draws[0].policy_version,
        )
        offered = tuple(c.offered for c in choices)
        earlier = conv.pending

        def remember() -> None:  # under the registry's lock, if the rollout is still open
            if earlier is not None and continued is not None:
                continue_choice(state.records, earlier, continued)
            remember_turn(conv, request, tools, prompt, offered, pending, body)

        self.registry.record_turn(state, request.role, conv, record, remember)
        return body

    def _choice(self, call: _Call, index: int, sampled: Sampled) -> _Choice:
        """One sampled choice of ``call``: cut at a stop string, parsed for tool calls,
        recorded, answered (``choices[index]``), and offered to the role's next request."""
        request = call.request
        sampled, content = cut_at_stop(  # stop strings: see turnrl.serve.stops
            sampled, request.stop, lambda ids: self.served.call(self.policy.decode, ids)
        )
        sample = sampled.sample
        parse_tools = call.tools if request.tools and request.tool_choice != "none" else ()
        reply = parse_reply(
            call.forced + content,
            parse_tools,
            self.config.tool_format,
            tool_call_id(call.state.rollout_id, call.turn),
        )
        finish = finish_reason(reply, sample)
        record = build_record(
            call.state,
            request.role,
            call.turn,
            call.prompt,
            call.prompt_ids,
            sampled,
            call.temperature,
            finish=finish,
            tool_call=bool(reply.tool_calls),
            rebuilt=call.rebuilt,
            forced=call.forced,
        )
        logprobs = response_logprobs(sampled, self.served) if request.logprobs else None
        body = choice_body(index, reply, finish, list(sample.response_ids), logprobs)
        context = next_context(call.prompt_ids, sample, self.policy.eos_token_id)
        offered = Offered(reply.as_chat_message().key(), call.forced + sample.text, context)
        return _Choice(record, body, offered)

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
        (``registry.problems``: the agent loop fails such a rollout). The finished trajectory is
        appended to ``records_path`` when configured (``records_written`` says
        whether it got there; if not it is kept and retried, see
        :class:`~turnrl.serve.recordsfile.RecordsFile`). Unknown rollouts are a
        404, closed ones a 409.
        """
        value = check_reward(reward)
        if task_id is not None:
            check_id(task_id, "task_id")
        self.registry.sweep()
        summary, finished = self.registry.finish(rollout_id, value, task_id, secret)
        if finished is not None and self._records_file is not None:
            summary["records_written"] = self._records_file.submit(finished)
        return summary

    def flush_records(self) -> int:
        """Retry writing trajectories a failed append left behind; how many remain."""
        return self._records_file.flush() if self._records_file is not None else 0
