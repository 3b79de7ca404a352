"""The gateway core: per-rollout token contexts, sampling, and turn records.

:class:`Gateway` turns validated chat requests into policy samples and records
each call as a turn record (``docs/turn-records.md``). It knows nothing of HTTP
(:mod:`turnrl.serve.app` wraps it), so a trainer can also drive it in-process.

Exact tokens. For each rollout the gateway keeps the token context of the last
turn: its ``prompt_ids + response_ids`` (plus the end-of-turn id when the
response was cut at ``max_tokens``, as the rollout runner does). A request
*extends* the last turn when its messages are the previous request's messages,
then the assistant message the gateway returned (compared by role, text and tool
calls, not ids), then new messages. Then:

* one new message: the context is the kept ids plus
  ``policy.encode_observation(message)``, so no sampled token is re-tokenised;
* several new messages: the whole conversation (with the sampled text for the
  assistant turn) is encoded with ``encode_initial``; if that starts with the
  kept ids the turn is exact, otherwise it is a rebuild.

Any other request (first call excepted) rewrote history: the context is
``encode_initial`` of the full messages and the record says
``context_rebuilt: true`` (counted in :attr:`Gateway.context_rebuilds`). Its
``prompt_ids`` then need not start with the previous turn's ids.

Records. Turn ``k`` of rollout ``r`` has ``traj_id=r``, ``turn=k``, the
messages the policy saw (``prompt``, tools described as in
:mod:`turnrl.serve.toolcalls`), ``prompt_ids``, ``response``, ``response_ids``,
``logprobs`` (under the sampling temperature, recorded as ``temperature``),
``reward=0`` and ``done=false`` until :meth:`Gateway.reward` puts the final
reward on the last turn and sets ``done=true``. Extra fields: ``finish_reason``,
``stop_reason``, ``tool_call``, ``context_rebuilt``, ``temperature``.

Concurrency. Rollout state lives in a dict guarded by one lock; a rollout takes
one request at a time (a second concurrent request on it gets HTTP 409).
Tokenizer calls share a lock with the sampler (fast tokenizers are not safe to
mutate from several threads); sampling goes through a
:class:`~turnrl.serve.batcher.MicroBatcher`.
"""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from turnrl.envs.tools import get_format
from turnrl.io import append_jsonl
from turnrl.serve.batcher import MicroBatcher
from turnrl.serve.errors import GatewayError, bad_request
from turnrl.serve.protocol import ChatRequest
from turnrl.serve.responses import completion_body, logprobs_content, tool_call_id
from turnrl.serve.toolcalls import parse_reply, to_policy_message, to_policy_messages
from turnrl.types import Message, Policy, Sample

T = TypeVar("T")

MAX_ID_LENGTH = 256
"""Longest rollout or task id accepted."""


@dataclass(frozen=True)
class GatewayConfig:
    """How the gateway samples, renders tools and stores records."""

    model_name: str = "turnrl-policy"
    """Model id in ``/v1/models`` and in responses (requests may name any model)."""
    tool_format: str = "tags"
    """Tool-call text format the policy writes: ``"tags"`` or ``"hermes"``."""
    tools_in_prompt: bool = True
    """Describe the request's ``tools`` in the system prompt; turn off when the
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


@dataclass
class _Rollout:
    """One trajectory in progress (mutated only under the gateway lock)."""

    rollout_id: str
    task_id: str
    task_id_explicit: bool
    records: list[dict[str, Any]] = field(default_factory=list)
    keys: tuple[Any, ...] = ()
    """Message keys of the previous request."""
    tools_key: str = ""
    reply_key: Any = None
    """Key of the assistant message returned last (None before the first turn)."""
    prompt: list[Message] = field(default_factory=list)
    response: str = ""
    context: list[int] = field(default_factory=list)
    """Ids the next turn extends: last prompt_ids + response_ids (+ end-of-turn)."""
    busy: bool = False
    finished: bool = False
    rebuilds: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "rollout_id": self.rollout_id,
            "task_id": self.task_id,
            "turns": len(self.records),
            "finished": self.finished,
            "context_rebuilds": self.rebuilds,
        }


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


class Gateway:
    """Serves a policy to agent programs and records their calls as turn records."""

    def __init__(self, policy: Policy, config: GatewayConfig | None = None) -> None:
        self.config = config if config is not None else GatewayConfig()
        get_format(self.config.tool_format)  # unknown formats fail here, not per request
        if not 1 <= self.config.default_max_tokens <= self.config.max_tokens_limit:
            raise ValueError("need 1 <= default_max_tokens <= max_tokens_limit")
        self.policy = policy
        self.context_rebuilds = 0
        """Turns whose context had to be re-encoded from text (history rewritten)."""
        self._lock = threading.Lock()
        self._policy_lock = threading.RLock()
        self._file_lock = threading.Lock()
        self._rollouts: dict[str, _Rollout] = {}
        self._batcher = MicroBatcher(
            policy,
            window_s=self.config.batch_window_s,
            max_batch=self.config.max_batch,
            lock=self._policy_lock,
        )

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop the sampling worker (requests after this fail)."""
        self._batcher.close()

    def __enter__(self) -> Gateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def batch_stats(self) -> dict[str, int]:
        """How requests were batched: ``calls``, ``requests``, ``largest``."""
        stats = self._batcher.stats
        return {"calls": stats.calls, "requests": stats.requests, "largest": stats.largest}

    # ---------------------------------------------------------------- completions
    def complete(
        self, request: ChatRequest, rollout_id: str, task_id: str | None = None
    ) -> dict[str, Any]:
        """Sample a reply for ``request`` in rollout ``rollout_id``; record the turn.

        Returns the OpenAI ``chat.completion`` body. Raises ``GatewayError`` for
        requests the gateway refuses.
        """
        state = self._claim(check_id(rollout_id, "rollout_id"), task_id)
        try:
            return self._complete(state, request)
        finally:
            with self._lock:
                state.busy = False
                if not state.records:  # a failed first call leaves no empty rollout
                    self._rollouts.pop(state.rollout_id, None)

    def _claim(self, rollout_id: str, task_id: str | None) -> _Rollout:
        """Get or create the rollout and mark it busy."""
        if task_id is not None:
            check_id(task_id, "task_id")
        with self._lock:
            state = self._rollouts.get(rollout_id)
            if state is None:
                state = _Rollout(rollout_id, task_id or rollout_id, task_id is not None)
                self._rollouts[rollout_id] = state
            if state.finished:
                raise GatewayError(
                    409,
                    f"rollout {rollout_id!r} is finished (its reward was posted)",
                    code="rollout_finished",
                )
            if state.busy:
                raise GatewayError(
                    409,
                    f"rollout {rollout_id!r} already has a request in progress",
                    code="rollout_busy",
                )
            if task_id is not None:
                self._set_task(state, task_id)
            state.busy = True
            return state

    @staticmethod
    def _set_task(state: _Rollout, task_id: str) -> None:
        """Fix the rollout's task id (once; a trajectory belongs to one task)."""
        if state.task_id_explicit and task_id != state.task_id:
            raise bad_request(
                f"rollout {state.rollout_id!r} belongs to task {state.task_id!r}, not {task_id!r}",
                "task_id",
            )
        state.task_id, state.task_id_explicit = task_id, True
        for record in state.records:
            record["task_id"] = task_id

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

    def _context(
        self, state: _Rollout, request: ChatRequest
    ) -> tuple[list[Message], list[int], bool]:
        """The turn's prompt messages, prompt ids, and whether they were rebuilt."""
        fmt = self.config.tool_format
        keys = tuple(m.key() for m in request.messages)
        n = len(state.keys)
        extends = (
            state.reply_key is not None
            and self._tools_key(request) == state.tools_key
            and len(keys) > n + 1
            and keys[:n] == state.keys
            and keys[n] == state.reply_key
        )
        if not extends:
            prompt = to_policy_messages(request, fmt, tools_in_prompt=self.config.tools_in_prompt)
            return prompt, self._encode_initial(prompt), state.reply_key is not None
        new = [to_policy_message(m, request.tools, fmt) for m in request.messages[n + 1 :]]
        prompt = [*state.prompt, {"role": "assistant", "content": state.response}, *new]
        if len(new) == 1:
            try:
                tail = self._policy_call(self.policy.encode_observation, new[0])
            except Exception as exc:
                raise bad_request(
                    f"the policy cannot encode message {len(keys) - 1}: {exc}", "messages"
                ) from exc
            return prompt, state.context + tail, False
        ids = self._encode_initial(prompt)
        return prompt, ids, ids[: len(state.context)] != state.context

    def _tools_key(self, request: ChatRequest) -> str:
        """What of the tools shapes the prompt: nothing unless they are described in it."""
        return request.tools_key() if self.config.tools_in_prompt else ""

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

    def _complete(self, state: _Rollout, request: ChatRequest) -> dict[str, Any]:
        prompt, prompt_ids, rebuilt = self._context(state, request)
        max_tokens, temperature = self._budget(request, prompt_ids)
        sample = self._batcher.submit(
            prompt_ids, max_new_tokens=max_tokens, temperature=temperature, seed=request.seed
        )
        turn = len(state.records)
        reply = parse_reply(
            sample.text,
            request.active_tools,
            self.config.tool_format,
            tool_call_id(state.rollout_id, turn),
        )
        if reply.tool_calls:
            finish = "tool_calls"
        else:
            finish = "length" if sample.stop_reason == "length" else "stop"
        record = self._record(state, turn, prompt, prompt_ids, sample, temperature)
        record.update(
            finish_reason=finish, tool_call=bool(reply.tool_calls), context_rebuilt=rebuilt
        )
        logprobs = self._logprobs(sample) if request.logprobs else None
        with self._lock:
            state.records.append(record)
            state.keys = tuple(m.key() for m in request.messages)
            state.tools_key = self._tools_key(request)
            state.reply_key = reply.as_chat_message().key()
            state.prompt, state.response = prompt, sample.text
            state.context = prompt_ids + list(sample.response_ids)
            if sample.stop_reason != "stop":
                state.context.append(self.policy.eos_token_id)
            if rebuilt:
                state.rebuilds += 1
                self.context_rebuilds += 1
            task_id = state.task_id
        return completion_body(
            rollout_id=state.rollout_id,
            task_id=task_id,
            turn=turn,
            model=self.config.model_name,
            reply=reply,
            finish_reason=finish,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(sample.response_ids),
            logprobs=logprobs,
            context_rebuilt=rebuilt,
        )

    @staticmethod
    def _record(
        state: _Rollout,
        turn: int,
        prompt: list[Message],
        prompt_ids: list[int],
        sample: Sample,
        temperature: float,
    ) -> dict[str, Any]:
        return {
            "task_id": state.task_id,
            "traj_id": state.rollout_id,
            "turn": turn,
            "role": "agent",
            "prompt": copy.deepcopy(prompt),
            "response": sample.text,
            "prompt_ids": list(prompt_ids),
            "response_ids": list(sample.response_ids),
            "logprobs": [float(x) for x in sample.logprobs],
            "reward": 0.0,
            "done": False,
            "stop_reason": sample.stop_reason,
            "temperature": float(temperature),
        }

    def _logprobs(self, sample: Sample) -> dict[str, Any]:
        """OpenAI logprobs of the response, without a final end-of-turn token."""
        ids, logprobs = list(sample.response_ids), list(sample.logprobs)
        if sample.stop_reason == "stop" and ids:
            ids, logprobs = ids[:-1], logprobs[:-1]
        with self._policy_lock:
            return logprobs_content(ids, logprobs, lambda i: self.policy.decode([i]))

    # --------------------------------------------------------------------- reward
    def reward(self, rollout_id: str, reward: Any, task_id: str | None = None) -> dict[str, Any]:
        """Put the final ``reward`` on the rollout's last turn and finish it.

        ``task_id`` (optional) names the task if the calls did not. The finished
        trajectory is appended to ``records_path`` when configured. Unknown
        rollouts raise a 404, finished or busy ones a 409.
        """
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise bad_request(f"reward must be a number, got {reward!r}", "reward")
        if not math.isfinite(reward):
            raise bad_request(f"reward must be finite, got {reward!r}", "reward")
        if task_id is not None:
            check_id(task_id, "task_id")
        with self._lock:
            state = self._get(rollout_id)
            if state.busy:
                raise GatewayError(
                    409, f"rollout {rollout_id!r} has a request in progress", code="rollout_busy"
                )
            if state.finished:
                raise GatewayError(
                    409, f"rollout {rollout_id!r} already has its reward", code="rollout_finished"
                )
            if task_id is not None:
                self._set_task(state, task_id)
            state.records[-1]["reward"] = float(reward)
            state.records[-1]["done"] = True
            state.finished = True
            finished = copy.deepcopy(state.records)
            summary = state.summary()
        if self.config.records_path is not None:
            with self._file_lock:
                for record in finished:
                    append_jsonl(Path(self.config.records_path), record)
        return {**summary, "reward": float(reward)}

    # -------------------------------------------------------------------- queries
    def _get(self, rollout_id: str) -> _Rollout:
        """The rollout (caller holds the lock); 404 if unknown."""
        state = self._rollouts.get(rollout_id)
        if state is None:
            raise GatewayError(404, f"unknown rollout {rollout_id!r}", param="rollout_id")
        return state

    def rollout(self, rollout_id: str) -> dict[str, Any]:
        """Summary and records of one rollout (404 if unknown)."""
        with self._lock:
            state = self._get(rollout_id)
            return {**state.summary(), "records": copy.deepcopy(state.records)}

    def rollouts(self) -> list[dict[str, Any]]:
        """Summaries of all rollouts, in order of their first call."""
        with self._lock:
            return [state.summary() for state in self._rollouts.values()]

    def records(self) -> list[dict[str, Any]]:
        """Copies of all turn records so far (unfinished rollouts included)."""
        with self._lock:
            return [copy.deepcopy(r) for s in self._rollouts.values() for r in s.records]

    def finished_records(self) -> list[dict[str, Any]]:
        """Copies of the records of finished rollouts (ready for ``TurnTable.from_records``)."""
        with self._lock:
            return [
                copy.deepcopy(r) for s in self._rollouts.values() if s.finished for r in s.records
            ]

    def pop_finished(self) -> list[dict[str, Any]]:
        """Records of finished rollouts, which are then forgotten (frees memory in
        long runs). A later call with a forgotten id starts a new trajectory with
        the same ``traj_id``, so give every rollout a fresh id."""
        with self._lock:
            done = [s for s in self._rollouts.values() if s.finished]
            for state in done:
                del self._rollouts[state.rollout_id]
            return [r for s in done for r in s.records]
