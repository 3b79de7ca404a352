"""Import production conversations (OpenAI chat-message format) as turn records.

One JSON object per line::

    {"conversation_id": "c-17", "task_id": "refund-policy",        # task_id optional
     "messages": [{"role": "system", "content": "..."},
                  {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "..."}, ...],
     "outcome": 1.0}

Each assistant message becomes one turn record: its prompt is every message
before it, its response the message's text, its reward the conversation's
``outcome`` on the LAST assistant turn (0 on the others), so the Monte Carlo
return of every turn is the outcome (``gamma = 1``). ``task_id`` defaults to the
conversation id. Extra keys (``name``, metadata...) are ignored.

Validation is strict and nothing is guessed: every problem raises
:class:`ChatLogError` (a ``TurnRecordError``) naming the file, the 1-based line
and the field (``messages[3].role``). Not supported, with a clear error:
assistant ``tool_calls`` without text content, roles other than ``system``,
``user``, ``assistant`` and ``tool``.

Tokenising (``tokenise_conversations``) uses the policy's chat template exactly
the way rollouts build contexts (``turnrl.train.update.sft.conversation_examples``), so
logged states look to the policy and to Q like states it produced itself.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnrl.errors import TurnRecordError
from turnrl.io import iter_jsonl
from turnrl.types import Message, TurnRecord

ROLES = ("system", "user", "assistant", "tool")


class ChatLogError(TurnRecordError):
    """A chat-log line is invalid (message names file, line and field)."""


@dataclass(frozen=True)
class Conversation:
    """One validated logged conversation."""

    conversation_id: str
    task_id: str
    messages: list[Message]
    outcome: float
    line: int


def _check_message(raw: Any, index: int, fail: Any) -> Message:
    where = f"messages[{index}]"
    if not isinstance(raw, dict):
        raise fail(where, f"must be an object with role and content, got {type(raw).__name__}")
    role = raw.get("role")
    if role is None:
        raise fail(f"{where}.role", "is missing")
    if role not in ROLES:
        raise fail(f"{where}.role", f"must be one of {', '.join(ROLES)}; got {role!r}")
    content = raw.get("content")
    if content is None and raw.get("tool_calls"):
        raise fail(
            f"{where}.tool_calls",
            "assistant tool calls are not supported; log the call as text content",
        )
    if content is None:
        raise fail(f"{where}.content", "is missing")
    if not isinstance(content, str):
        raise fail(f"{where}.content", f"must be a string, got {type(content).__name__}")
    return {"role": role, "content": content}


def parse_conversation(obj: Any, source: str, line: int) -> Conversation:
    """Validate one decoded JSON line."""

    def fail(field: str | None, problem: str) -> ChatLogError:
        return ChatLogError(source, line, field, problem)

    if not isinstance(obj, dict):
        raise fail(None, f"each line must be a JSON object, got {type(obj).__name__}")
    conversation_id = obj.get("conversation_id")
    if not isinstance(conversation_id, str) or not conversation_id:
        raise fail("conversation_id", f"is required (a non-empty string), got {conversation_id!r}")
    task_id = obj.get("task_id", conversation_id)
    if not isinstance(task_id, str) or not task_id:
        raise fail("task_id", f"must be a non-empty string when given, got {task_id!r}")
    if "messages" not in obj:
        raise fail("messages", "is missing")
    raw_messages = obj["messages"]
    if not isinstance(raw_messages, list) or not raw_messages:
        raise fail("messages", "must be a non-empty list of chat messages")
    messages = [_check_message(m, i, fail) for i, m in enumerate(raw_messages)]
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not assistant:
        raise fail("messages", "has no assistant message (nothing to learn from)")
    if assistant[0] == 0:
        raise fail(
            "messages[0].role",
            "the conversation starts with an assistant message; "
            "its state would be empty (log the system/user messages before it)",
        )
    if "outcome" not in obj:
        raise fail("outcome", "is missing (one number per conversation)")
    outcome = obj["outcome"]
    if isinstance(outcome, bool) or not isinstance(outcome, int | float):
        raise fail("outcome", f"must be a number, got {type(outcome).__name__}")
    if not math.isfinite(float(outcome)):
        raise fail("outcome", f"must be finite, got {outcome!r}")
    return Conversation(conversation_id, task_id, messages, float(outcome), line)


def read_chat_logs(path: str | Path) -> list[Conversation]:
    """Read and validate a chat-log JSONL file (blank lines are skipped).

    Lines are parsed by the strict reader of :mod:`turnrl.io` (invalid UTF-8, lone
    surrogates, duplicate keys, numbers beyond 64 bits, ``NaN``, too deep nesting are
    refused, naming the field). Raises ``ChatLogError`` for those, bad fields, a
    repeated ``conversation_id`` (naming both lines), an empty file, or a file that
    cannot be read.
    """
    source = str(path)
    conversations: list[Conversation] = []
    seen: dict[str, int] = {}
    for number, obj in iter_jsonl(path, error=ChatLogError):
        conversation = parse_conversation(obj, source, number)
        first = seen.setdefault(conversation.conversation_id, number)
        if first != number:
            raise ChatLogError(
                source,
                number,
                "conversation_id",
                f"{conversation.conversation_id!r} repeats line {first}",
            )
        conversations.append(conversation)
    if not conversations:
        raise ChatLogError(source, None, None, "no conversations in the file")
    return conversations


def conversation_records(conversation: Conversation) -> list[TurnRecord]:
    """Turn records (text only: ``prompt`` messages and ``response``) of one conversation."""
    messages = conversation.messages
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    records = []
    for turn, index in enumerate(turns):
        last = turn == len(turns) - 1
        records.append(
            TurnRecord(
                task_id=conversation.task_id,
                traj_id=conversation.conversation_id,
                turn=turn,
                prompt=tuple(dict(m) for m in messages[:index]),
                response=messages[index]["content"],
                reward=conversation.outcome if last else 0.0,
                done=last,
                source_line=conversation.line,
            )
        )
    return records


def tokenise_conversations(
    policy: Any,
    conversations: Sequence[Conversation],
    *,
    source: str = "<chat logs>",
    max_new_tokens: int = 0,
) -> list[TurnRecord]:
    """Turn records with exact ``prompt_ids``/``response_ids`` under ``policy``'s template.

    ``policy`` is an ``HFPolicy``. Responses end with the end-of-turn token (as a
    sampled response that stopped normally does); behaviour log-probs are unknown
    and left out. A message the chat template or tokenizer rejects raises
    ``ChatLogError`` naming the conversation's line, and so does a turn too long for
    the model: its context plus the longer of its logged response and
    ``max_new_tokens`` (new candidates are sampled from logged contexts) must fit the
    model's positions.
    """
    from turnrl.train.update.sft import conversation_examples

    limit = getattr(policy, "max_context", None)
    records: list[TurnRecord] = []
    for conversation in conversations:
        try:
            examples = conversation_examples(policy, conversation.messages)
        except Exception as err:  # the template's own error, with our location
            raise ChatLogError(
                source, conversation.line, "messages", f"cannot tokenise: {err}"
            ) from err
        text_records = conversation_records(conversation)
        for record, example in zip(text_records, examples, strict=True):
            needed = len(example.context) + max(len(example.response), max_new_tokens)
            if limit is not None and needed > limit:
                raise ChatLogError(
                    source,
                    conversation.line,
                    "messages",
                    f"assistant turn {record.turn}: {len(example.context)} context tokens "
                    f"+ {max(len(example.response), max_new_tokens)} response tokens exceed "
                    f"the model's {limit} positions",
                )
            records.append(
                dataclasses.replace(
                    record,
                    prompt_ids=tuple(example.context),
                    response_ids=tuple(example.response),
                )
            )
    return records
