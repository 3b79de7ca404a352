"""``turnrl serve``: an OpenAI-compatible gateway that records agent programs' calls.

An agent written against any OpenAI client points its ``base_url`` at the
gateway; every chat completion is sampled from the policy and recorded as a
turn record with exact prompt/response token ids and log-probs, grouped into
trajectories by a rollout id; the agent posts the final reward at the end.
Every request needs the gateway's key, and browsers are refused
(:mod:`turnrl.serve.guard`; ``docs/gateway.md``, "Trust model").
See ``docs/gateway.md`` (its first section is the in-process API a training
loop uses: :class:`Gateway`, :class:`GatewayServer`, :func:`bind_socket`).

The core (:class:`Gateway`) needs no web framework; the HTTP app and server
(:func:`create_app`, :class:`GatewayServer`, :class:`RolloutEndpoint`) need
``starlette`` and ``uvicorn`` and are imported on first use.
"""

from __future__ import annotations

from typing import Any

from turnrl.serve.errors import GatewayError
from turnrl.serve.gateway import Gateway, GatewayConfig
from turnrl.serve.net import BindError, PortInUseError, bind_socket
from turnrl.serve.protocol import ChatRequest, parse_chat_request
from turnrl.serve.recordsfile import RecordsPathError
from turnrl.serve.rollouts import ClosedRollout, FinishedRollout

__all__ = [
    "BindError",
    "ChatRequest",
    "ClosedRollout",
    "FinishedRollout",
    "Gateway",
    "GatewayConfig",
    "GatewayError",
    "GatewayServer",
    "PortInUseError",
    "RecordsPathError",
    "RolloutEndpoint",
    "bind_socket",
    "create_app",
    "parse_chat_request",
]

_LAZY = {
    "create_app": "turnrl.serve.app",
    "GatewayServer": "turnrl.serve.server",
    "RolloutEndpoint": "turnrl.serve.server",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'turnrl.serve' has no attribute {name!r}")
