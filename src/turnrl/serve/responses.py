"""OpenAI chat-completion response bodies (plain and streamed) built from one sample.

``logprobs`` follow OpenAI's shape (``{"content": [{"token", "logprob",
"bytes", "top_logprobs": []}]}``) and list the response tokens without the
final end-of-turn token, as OpenAI does; the turn record keeps all of them.
Every body carries a ``turnrl`` object (rollout id, task id, turn index and
whether the context was rebuilt), which OpenAI clients keep as an extra field.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from turnrl.serve.toolcalls import Reply


def completion_id(rollout_id: str, turn: int) -> str:
    """A stable id for a rollout's turn (``chatcmpl-`` + 24 hex digits)."""
    digest = hashlib.blake2b(f"{rollout_id}\x00{turn}".encode(), digest_size=12).hexdigest()
    return f"chatcmpl-{digest}"


def tool_call_id(rollout_id: str, turn: int) -> str:
    """A stable id for the tool call of a rollout's turn (``call_`` + 24 hex digits)."""
    return "call_" + completion_id(rollout_id, turn).removeprefix("chatcmpl-")


def logprobs_content(
    token_ids: Sequence[int], logprobs: Sequence[float], token_text: Callable[[int], str]
) -> dict[str, Any]:
    """OpenAI's ``choices[0].logprobs`` for the given tokens."""
    content = []
    for token, logprob in zip(token_ids, logprobs, strict=True):
        text = token_text(token)
        content.append(
            {
                "token": text,
                "logprob": float(logprob),
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": [],
            }
        )
    return {"content": content, "refusal": None}


def completion_body(
    *,
    rollout_id: str,
    task_id: str,
    turn: int,
    model: str,
    reply: Reply,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    logprobs: dict[str, Any] | None,
    context_rebuilt: bool,
) -> dict[str, Any]:
    """A ``chat.completion`` object with one choice."""
    return {
        "id": completion_id(rollout_id, turn),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": reply.message(),
                "finish_reason": finish_reason,
                "logprobs": logprobs,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "turnrl": {
            "rollout_id": rollout_id,
            "task_id": task_id,
            "turn": turn,
            "context_rebuilt": context_rebuilt,
        },
    }


def stream_chunks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A finished completion as ``chat.completion.chunk`` objects for SSE.

    The whole response is generated before streaming starts, so it is sent as
    one content/tool-call delta and a closing chunk with ``finish_reason`` and
    ``usage``: enough for clients that insist on ``stream=True``.
    """
    choice = body["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
    if "tool_calls" in message:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    head = {k: body[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    first = {
        **head,
        "choices": [
            {"index": 0, "delta": delta, "finish_reason": None, "logprobs": choice["logprobs"]}
        ],
    }
    last = {
        **head,
        "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
        "usage": body["usage"],
        "turnrl": body["turnrl"],
    }
    return [first, last]
