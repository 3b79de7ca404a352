"""Request limits: ids, rewards, request size before tokenising, the response budget.

Everything here refuses bad input with a 400 (:func:`~turnrl.serve.errors.bad_request`)
before the gateway spends work on it: a huge body is refused by its size
(:func:`max_body_bytes`, enforced by the HTTP app while reading), a request that
cannot fit the context by its characters (:func:`check_size`), and a context
that leaves no room for a response once it is tokenised (:func:`budget`), or whose
prompt plus ``max_tokens`` exceed the per-turn cap (:class:`ContextCapExceeded`).
"""

from __future__ import annotations

from typing import Any

from turnrl.options import finite_real
from turnrl.serve.config import GatewayConfig
from turnrl.serve.errors import GatewayError, bad_request
from turnrl.serve.protocol import ChatRequest

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
    """A finite real number, as a float: a JSON number, or (from an in-process agent) a
    NumPy scalar such as ``float32``; bools, strings and huge integers are refused."""
    number = finite_real(value)
    if number is None:
        raise bad_request(f"{param} must be a finite number, got {value!r}", param)
    return number


def max_request_chars(config: GatewayConfig, max_context: int | None) -> int | None:
    """Most characters of text a request may hold (``None``: no bound)."""
    if config.max_request_chars is not None:
        return config.max_request_chars
    return None if max_context is None else CHARS_PER_TOKEN_BOUND * max_context


def max_body_bytes(chars: int | None, max_context: int | None) -> int | None:
    """Largest JSON body that can hold a request of at most ``chars`` characters of text
    and at most ``max_context`` messages (``None``: no bound)."""
    if chars is None:
        return None
    messages = max_context or 0
    return JSON_BYTES_PER_CHAR * chars + MESSAGE_OVERHEAD_BYTES * messages + BODY_SLACK_BYTES


def check_size(request: ChatRequest, max_context: int | None, chars: int | None) -> None:
    """400 for requests that cannot fit the context, before any tokenising."""
    if max_context is not None and len(request.messages) >= max_context:
        raise bad_request(
            f"{len(request.messages)} messages cannot fit a context of {max_context} positions",
            "messages",
            code="context_length_exceeded",
        )
    size = request.characters()
    if chars is not None and size > chars:
        raise bad_request(
            f"the request has {size} characters of text; this gateway accepts at most "
            f"{chars} (the model's context is {max_context} positions)",
            "messages",
            code="context_length_exceeded",
        )


class ContextCapExceeded(GatewayError):
    """A call over the per-turn context cap (``GatewayConfig.max_context_tokens``): the
    400 ``context_length_exceeded`` OpenAI answers a prompt plus ``max_tokens`` over the
    model's context with (its message says the same numbers), so clients and agent
    frameworks that handle that error handle this one. The gateway ends the rollout
    truncated when it raises it."""

    def __init__(self, cap: int, prompt_tokens: int, max_tokens: int) -> None:
        super().__init__(
            400,
            f"This rollout's maximum context length is {cap} tokens (the per-turn context "
            f"cap). However, you requested {prompt_tokens + max_tokens} tokens "
            f"({prompt_tokens} in the messages, {max_tokens} in the completion). The "
            "rollout has ended truncated at the context cap; post its reward.",
            param="messages",
            code="context_length_exceeded",
        )


def budget(
    request: ChatRequest, prompt_ids: list[int], config: GatewayConfig, max_context: int | None
) -> tuple[int, float]:
    """``max_new_tokens`` and temperature; 400 if the context leaves no room
    (:class:`ContextCapExceeded` if it is over the per-turn cap)."""
    max_tokens = request.max_tokens or config.default_max_tokens
    if max_tokens > config.max_tokens_limit:
        raise bad_request(
            f"max_tokens={max_tokens} exceeds this gateway's limit ({config.max_tokens_limit})",
            "max_tokens",
        )
    cap = config.max_context_tokens
    if cap is not None and len(prompt_ids) + max_tokens > cap:
        raise ContextCapExceeded(cap, len(prompt_ids), max_tokens)
    if max_context is not None and len(prompt_ids) >= max_context:
        raise bad_request(
            f"the conversation is {len(prompt_ids)} tokens; the model accepts at most "
            f"{max_context} positions including the response",
            "messages",
            code="context_length_exceeded",
        )
    temperature = request.temperature
    return max_tokens, config.default_temperature if temperature is None else temperature
