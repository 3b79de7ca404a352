"""Warm start for any agent: run it against a scripted teacher behind the gateway.

``warm_start.teacher = "module:function"`` names a function
``teach(messages, tools, task) -> message`` that maps one chat call (its
messages and tools as OpenAI dicts, and the task) to the assistant message a
good agent would send back (``{"role": "assistant", "content": ...}``, with
``tool_calls`` to call a tool).

The agent program runs unchanged against a :class:`TeacherGateway`: a gateway
whose "policy" answers each call with the teacher's message, written in the
policy's tool-call format and tokenised as the policy would emit it. Everything
else is the gateway's own code path (tool descriptions in the prompt, exact
token contexts across turns, tool calls handed back to the agent), so the
recorded ``prompt_ids``/``response_ids`` are the exact tokens the policy will see
and produce under RL. Supervised fine-tuning on those turns
(:func:`teacher_examples`) is the warm start: no prompt template is written by
hand anywhere.

Calls are answered one at a time (the teacher's reply is handed to the sampler
through one slot); agents still run concurrently between calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from turnrl.serve import Gateway, GatewayConfig, GatewayError
from turnrl.serve.protocol import ChatMessage, ChatRequest, ToolSpec, parse_message
from turnrl.serve.toolcalls import message_text
from turnrl.train.agent.contract import load_callable
from turnrl.train.update.sft import TurnExample
from turnrl.types import Policy, Sample, TurnRecord

Teacher = Callable[[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]], dict[str, Any]]


def load_teacher(spec: str) -> Teacher:
    """The function ``warm_start.teacher`` names (``module:function`` or ``file.py:function``)."""
    return load_callable(spec, "warm_start.teacher", arity=3)


def message_dict(message: ChatMessage) -> dict[str, Any]:
    """A parsed request message back as the OpenAI dict a teacher reads."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def tool_dict(tool: ToolSpec) -> dict[str, Any]:
    """A parsed tool back as the OpenAI function-tool dict."""
    function = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    return {"type": "function", "function": function}


class TeacherPolicy:
    """A :class:`~turnrl.types.Policy` that "samples" the teacher's reply of the current call.

    Tokenisation is the real policy's; the response is the reply text's ids plus the
    end-of-turn id (as :func:`turnrl.train.update.sft.encode_response` builds SFT targets),
    with log-prob 0 (a demonstration, never trained on as a sample).
    """

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.eos_token_id = policy.eos_token_id
        self.max_context = policy.max_context
        self.reply: str | None = None

    def encode_initial(self, messages: list[dict[str, str]]) -> list[int]:
        return self.policy.encode_initial(messages)

    def encode_observation(self, message: dict[str, str]) -> list[int]:
        return self.policy.encode_observation(message)

    def decode(self, ids: list[int]) -> str:
        return self.policy.decode(ids)

    def sample(self, contexts: list[list[int]], **_: Any) -> list[Sample]:
        if len(contexts) != 1 or self.reply is None:
            raise RuntimeError("the teacher answers one call at a time")
        text = self.reply
        ids = [
            *self.policy.tokenizer(text, add_special_tokens=False)["input_ids"],
            self.eos_token_id,
        ]
        return [Sample(response_ids=ids, logprobs=[0.0] * len(ids), stop_reason="stop", text=text)]


class TeacherGateway(Gateway):
    """A gateway whose replies come from a scripted teacher instead of the policy."""

    def __init__(
        self,
        policy: Policy,
        teacher: Teacher,
        tasks_by_rollout: dict[str, dict[str, Any]],
        config: GatewayConfig | None = None,
    ) -> None:
        self.teacher_policy = TeacherPolicy(policy)
        super().__init__(self.teacher_policy, config)
        self.teacher = teacher
        self.tasks_by_rollout = tasks_by_rollout
        """The task of each rollout id (filled by the caller before the agents run)."""
        self._one_call = threading.Lock()

    def teacher_reply(self, request: ChatRequest, rollout_id: str) -> str:
        """The teacher's message for ``request``, as the text the policy would write."""
        messages = [message_dict(m) for m in request.messages]
        tools = [tool_dict(t) for t in request.tools]
        try:
            reply = self.teacher(messages, tools, self.tasks_by_rollout[rollout_id])
        except Exception as exc:
            raise teacher_error(f"raised {type(exc).__name__}: {exc}") from exc
        try:
            parsed = parse_message(reply, len(messages))
        except GatewayError as exc:
            raise teacher_error(f"returned a bad message {reply!r}: {exc.message}") from exc
        if parsed.role != "assistant":
            raise teacher_error(f"must return an assistant message, got {reply!r}")
        return message_text(parsed, request.tools, self.config.tool_format)

    def complete(
        self,
        request: ChatRequest,
        rollout_id: str,
        task_id: str | None = None,
        *,
        secret: str | None = None,
    ) -> dict[str, Any]:
        self.registry.check_access(rollout_id, secret)  # before the teacher sees the request
        with self._one_call:
            self.teacher_policy.reply = self.teacher_reply(request, rollout_id)
            try:
                return super().complete(request, rollout_id, task_id, secret=secret)
            finally:
                self.teacher_policy.reply = None


def teacher_error(problem: str) -> GatewayError:
    """The error the agent gets (and its failure report shows) when the teacher is broken."""
    return GatewayError(500, f"warm_start.teacher {problem}", code="teacher_error")


def teacher_examples(records: Sequence[TurnRecord]) -> list[TurnExample]:
    """One SFT example per teacher turn: its exact context ids and response ids."""
    return [TurnExample(list(r.prompt_ids or ()), list(r.response_ids or ())) for r in records]
