"""The gateway's settings (:class:`GatewayConfig`), read by every part of the gateway."""

from __future__ import annotations

from dataclasses import dataclass


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
    max_context_tokens: int | None = None
    """Per-turn context cap (the agent loop passes ``rollout.max_context_tokens``): a call
    whose prompt plus ``max_tokens`` exceed it is not sampled; it gets a 400
    ``context_length_exceeded``, its rollout ends truncated (``truncated: "context"``
    in its summary; later calls get the same 400) and may still post its reward.
    ``None``: only the model's context bounds a call."""
    auto_open: bool = True
    """A call naming an unknown rollout id starts that rollout (``turnrl serve``,
    where clients choose ids). The agent loop sets ``False``: only rollouts it
    opened with :meth:`Gateway.open_rollout` are served, any other id is a 404."""
