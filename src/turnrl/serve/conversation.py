"""Conversation extension: the exact token context of a turn, and when it is rebuilt.

Each role of a rollout keeps the token context of its last turn
(:class:`~turnrl.serve.rollouts.Conversation`): ``prompt_ids + response_ids``, plus
the end-of-turn id when the response was cut at ``max_tokens`` (as the rollout
runner does, :func:`next_context`), one per choice the call returned. A request
*extends* the last turn when its messages are the previous request's messages, then
an assistant message the gateway returned (compared by role, text and tool calls, not
ids; with several choices, the first choice it equals is the one continued), then new
messages (:meth:`ContextBuilder.context`). Then:

* one new message: the context is the kept ids plus
  ``policy.encode_observation(message)``, so no sampled token is re-tokenised;
* several new messages: the whole conversation (with the sampled text for the
  assistant turn) is encoded with ``encode_initial``; if that starts with the
  kept ids the turn is exact, otherwise it is a rebuild.

Any other request (first call excepted) rewrote history: the context is
``encode_initial`` of the full messages, and the turn is a rebuild.

A request that forces a tool call (``tool_choice`` ``"required"`` or a named function)
has the forced start of the call (:func:`~turnrl.serve.toolcalls.forced_call_prefix`)
appended to its context as text ids (:meth:`ContextBuilder.forced`): they are prompt
ids of the turn, never sampled, and the next turn extends them like any context.
"""

from __future__ import annotations

from typing import Any

from turnrl.serve.config import GatewayConfig
from turnrl.serve.errors import bad_request
from turnrl.serve.protocol import ChatRequest, ToolSpec, tools_key
from turnrl.serve.rollouts import Conversation, Offered, PendingChoices
from turnrl.serve.toolcalls import forced_call_prefix, to_policy_message, to_policy_messages
from turnrl.serve.weights import ServedPolicy
from turnrl.types import Message, Sample


class ContextBuilder:
    """Turns a request on a role's conversation into the prompt the policy sees."""

    def __init__(self, config: GatewayConfig, served: ServedPolicy) -> None:
        self.config = config
        self.served = served

    def tools_key(self, tools: tuple[ToolSpec, ...]) -> str:
        """What of the tools shapes the prompt: nothing unless they are described in it."""
        return tools_key(tools) if self.config.tools_in_prompt else ""

    def encode_initial(self, messages: list[Message]) -> list[int]:
        """``policy.encode_initial`` under the policy lock; a 400 if it fails."""
        try:
            return self.served.call(self.served.policy.encode_initial, messages)
        except Exception as exc:
            raise bad_request(
                f"the policy cannot encode these messages: {exc}", "messages"
            ) from exc

    def forced(self, request: ChatRequest) -> tuple[str, list[int]]:
        """The forced start of the reply and its ids, ``("", [])`` when nothing is forced.

        A call is forced when ``tool_choice`` is ``"required"`` (a named function is
        too) and the policy encodes text (``policy.chat``, as every turnrl backend
        does). A policy that does not (the warm start's scripted teacher, whose reply
        is a whole demonstration) writes the whole call itself."""
        chat = getattr(self.served.policy, "chat", None)
        if request.tool_choice != "required" or chat is None:
            return "", []
        fmt = self.config.tool_format
        prefix = forced_call_prefix(request.tools, fmt, request.forced_function)
        return prefix, self.served.call(chat.encode_text, prefix)

    def continued(
        self, conv: Conversation, request: ChatRequest, tools: tuple[ToolSpec, ...]
    ) -> int | None:
        """Which of the last call's choices ``request`` extends (the first it equals),
        or ``None`` when it extends none of them (the first call, or history rewritten)."""
        keys = tuple(m.key() for m in request.messages)
        n = len(conv.keys)
        if not (
            conv.offered
            and self.tools_key(tools) == self.tools_key(conv.tools)
            and len(keys) > n + 1
            and keys[:n] == conv.keys
        ):
            return None
        return next((i for i, o in enumerate(conv.offered) if o.key == keys[n]), None)

    def context(
        self, conv: Conversation, request: ChatRequest, tools: tuple[ToolSpec, ...]
    ) -> tuple[list[Message], list[int], bool, int | None]:
        """The turn's prompt messages, prompt ids, whether they were rebuilt, and which
        of the last call's choices the request continues (``None``: none)."""
        fmt = self.config.tool_format
        k = self.continued(conv, request, tools)
        if k is None:
            prompt = to_policy_messages(
                request.messages, tools, fmt, tools_in_prompt=self.config.tools_in_prompt
            )
            return prompt, self.encode_initial(prompt), bool(conv.offered), None
        offered = conv.offered[k]
        new = [to_policy_message(m, tools, fmt) for m in request.messages[len(conv.keys) + 1 :]]
        prompt = [*conv.prompt, {"role": "assistant", "content": offered.response}, *new]
        if len(new) == 1:
            policy = self.served.policy
            try:
                tail = self.served.call(policy.encode_observation, new[0])
            except Exception as exc:
                raise bad_request(
                    f"the policy cannot encode message {len(request.messages) - 1}: {exc}",
                    "messages",
                ) from exc
            return prompt, offered.context + tail, False, k
        ids = self.encode_initial(prompt)
        return prompt, ids, ids[: len(offered.context)] != offered.context, k


def next_context(prompt_ids: list[int], sample: Sample, eos_token_id: int) -> list[int]:
    """The ids the role's next turn extends: prompt, response, and the end-of-turn id
    when the response did not end with one (cut at ``max_tokens``)."""
    context = prompt_ids + list(sample.response_ids)
    if sample.stop_reason != "stop":
        context.append(eos_token_id)
    return context


def remember_turn(
    conv: Conversation,
    request: ChatRequest,
    tools: tuple[ToolSpec, ...],
    prompt: list[Message],
    offered: tuple[Offered, ...],
    pending: PendingChoices | None,
    body: dict[str, Any],
) -> None:
    """Keep what the role's next request is compared with (and a retry answered with)."""
    conv.keys = tuple(m.key() for m in request.messages)
    conv.tools = tools
    conv.prompt, conv.offered, conv.pending = prompt, offered, pending
    conv.last_request, conv.last_result = request, body
