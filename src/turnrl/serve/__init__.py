"""``turnrl serve``: an OpenAI-compatible gateway that records agent programs' calls.

An agent written against any OpenAI client points its ``base_url`` at the
gateway; every chat completion is sampled from the policy and recorded as a
turn record with exact prompt/response token ids and log-probs, grouped into
trajectories by a rollout id; the agent posts the final reward at the end.
See ``docs/gateway.md``.

The core (:class:`Gateway`) needs no web framework; the HTTP app and server
(:func:`create_app`, :class:`GatewayServer`) need ``starlette`` and
``uvicorn`` and are imported on first use.
"""

from __future__ import annotations

from typing import Any

from turnrl.serve.errors import GatewayError
from turnrl.serve.gateway import Gateway, GatewayConfig
from turnrl.serve.protocol import ChatRequest, parse_chat_request

__all__ = [
    "ChatRequest",
    "Gateway",
    "GatewayConfig",
    "GatewayError",
    "GatewayServer",
    "create_app",
    "parse_chat_request",
]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from turnrl.serve.app import create_app

        return create_app
    if name == "GatewayServer":
        from turnrl.serve.server import GatewayServer

        return GatewayServer
    raise AttributeError(f"module 'turnrl.serve' has no attribute {name!r}")
