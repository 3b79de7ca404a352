"""OpenAI chat-completion response bodies (plain and streamed) built from one sample.

``logprobs`` follow OpenAI's shape (``{"content": [{"token", "logprob",
"bytes", "top_logprobs": []}]}``) and list the response tokens without the
final end-of-turn token, as OpenAI does; the turn record keeps all of them.

Token ids come back the way vLLM returns them (``return_token_ids``), which is
where Agent Lightning's tracer and its triplet export look: ``prompt_token_ids``
at the top level and ``choices[i].token_ids`` (the recorded ``response_ids``,
end-of-turn token included). Every body also carries a ``turnrl`` object
(rollout id, task id, turn index, whether the context was rebuilt, policy
version), which OpenAI clients keep as an extra field.

With ``n`` choices, ``usage`` counts the prompt once and the tokens of every choice
(``completion_tokens`` is their sum), as OpenAI and vLLM count them.
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


def choice_body(
    index: int,
    reply: Reply,
    finish_reason: str,
    response_ids: list[int],
    logprobs: dict[str, Any] | None,
) -> dict[str, Any]:
    """One entry of a completion's ``choices``."""
    return {
        "index": index,
        "message": reply.message(),
        "finish_reason": finish_reason,
        "logprobs": logprobs,
        "token_ids": response_ids,
    }


def completion_body(
    *,
    rollout_id: str,
    task_id: str,
    turn: int,
    model: str,
    choices: list[dict[str, Any]],
    prompt_ids: list[int],
    context_rebuilt: bool,
    policy_version: int,
) -> dict[str, Any]:
    """A ``chat.completion`` object with the given choices (:func:`choice_body`)."""
    prompt_tokens = len(prompt_ids)
    completion_tokens = sum(len(choice["token_ids"]) for choice in choices)
    return {
        "id": completion_id(rollout_id, turn),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "prompt_token_ids": prompt_ids,
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
            "policy_version": policy_version,
        },
    }


def stream_chunks(body: dict[str, Any], *, include_usage: bool) -> list[dict[str, Any]]:
    """A finished completion as ``chat.completion.chunk`` objects for SSE.

    The whole response is generated before streaming starts. Content and tool
    calls go in separate deltas, because clients such as autogen read a delta's
    content and then skip the rest of it: per choice, in index order, first the
    content (with the role and the log-probs), then one chunk per tool call, then
    the chunk with ``finish_reason`` and the token ids; the last choice's final
    chunk also carries ``prompt_token_ids`` and the ``turnrl`` object. With
    ``include_usage`` a last chunk with no choices carries ``usage``, as OpenAI
    sends it.
    """
    head = {k: body[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    chunks = []
    for choice in body["choices"]:
        chunks += _choice_chunks(head, choice)
    chunks[-1]["prompt_token_ids"] = body["prompt_token_ids"]
    chunks[-1]["turnrl"] = body["turnrl"]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": body["usage"]})
    return chunks


def _choice_chunks(head: dict[str, Any], choice: dict[str, Any]) -> list[dict[str, Any]]:
    """One choice's chunks: content, tool calls, then its finish."""
    message = choice["message"]

    def chunk(delta: dict[str, Any], **choice_fields: Any) -> dict[str, Any]:
        fields = {"index": choice["index"], "delta": delta, "finish_reason": None}
        return {**head, "choices": [{**fields, **choice_fields}]}

    calls = message.get("tool_calls", [])
    chunks = []
    if message["content"] or not calls:
        chunks.append(
            chunk(
                {"role": "assistant", "content": message["content"] or ""},
                logprobs=choice["logprobs"],
            )
        )
    for i, call in enumerate(calls):
        delta: dict[str, Any] = {"tool_calls": [{"index": i, **call}]}
        if not chunks:
            delta = {"role": "assistant", "content": None, **delta}
        chunks.append(chunk(delta, logprobs=choice["logprobs"] if not chunks else None))
    chunks.append(chunk({}, finish_reason=choice["finish_reason"], token_ids=choice["token_ids"]))
    return chunks
