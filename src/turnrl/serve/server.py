"""Run the gateway app with uvicorn: in a background thread, or in the foreground.

:class:`GatewayServer` is what tests and in-process trainers use: it serves on a
socket bound up front (:func:`~turnrl.serve.net.bind_socket`, ``port=0`` for a
free port) from a thread, waits until it accepts connections, and hands out
per-rollout endpoints (:class:`RolloutEndpoint`) for OpenAI clients and agent
subprocesses. :meth:`GatewayServer.stop` joins the thread; with
:meth:`Gateway.close <turnrl.serve.gateway.Gateway.close>` nothing keeps running.

The gateway has no authentication, so it binds to loopback addresses only
unless ``allow_remote=True`` is passed explicitly.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import uvicorn

from turnrl.serve.app import create_app
from turnrl.serve.gateway import Gateway
from turnrl.serve.net import bind_socket, check_host, is_loopback

__all__ = ["GatewayServer", "RolloutEndpoint", "check_host", "is_loopback", "uvicorn_config"]

API_KEY = "turnrl"
"""What endpoints hand out as the API key: clients insist on one; the gateway ignores it."""


def uvicorn_config(
    gateway: Gateway,
    host: str,
    port: int,
    log_level: str,
    *,
    reload: Any = None,
) -> uvicorn.Config:
    """The uvicorn configuration shared by the thread and foreground servers."""
    return uvicorn.Config(
        create_app(gateway, reload=reload),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        lifespan="off",
    )


@dataclass(frozen=True)
class RolloutEndpoint:
    """Where one agent run talks to the gateway (ids already in the URLs)."""

    rollout_id: str
    task_id: str | None
    base_url: str
    """OpenAI ``base_url``: ``http://HOST:PORT[/tasks/TASK]/rollouts/ROLLOUT/v1``."""
    reward_url: str
    """POST ``{"reward": x}`` (or Agent Lightning's reward event) here."""
    agl_base_url: str
    """Agent Lightning's ``AGL_OPENAI_BASE_URL`` form of ``base_url``."""
    event_url: str
    """Agent Lightning's ``AGL_EVENT_URL`` for this rollout."""
    api_key: str = API_KEY

    def env(self) -> dict[str, str]:
        """Environment variables for an agent subprocess: the OpenAI client's and
        Agent Lightning's (so its published agents run unchanged)."""
        return {
            "OPENAI_BASE_URL": self.base_url,
            "OPENAI_API_KEY": self.api_key,
            "AGL_OPENAI_BASE_URL": self.agl_base_url,
            "AGL_EVENT_URL": self.event_url,
            "AGL_KEY": self.api_key,
        }


class GatewayServer:
    """Serve a :class:`Gateway` over HTTP from a background thread.

    Use as a context manager::

        with Gateway(policy) as gateway, GatewayServer(gateway) as server:
            client = openai.OpenAI(base_url=server.base_url("rollout-1"), api_key="-")

    Pass ``sock`` (from :func:`~turnrl.serve.net.bind_socket`) to bind before
    loading a model; otherwise ``host``/``port`` are bound here, and a busy port
    raises :class:`~turnrl.serve.net.PortInUseError` at once.
    """

    def __init__(
        self,
        gateway: Gateway,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        sock: socket.socket | None = None,
        allow_remote: bool = False,
        log_level: str = "warning",
        start_timeout_s: float = 30.0,
        reload: Any = None,
    ) -> None:
        if sock is None:
            sock = bind_socket(host, port, allow_remote=allow_remote)
        else:
            host = sock.getsockname()[0]
            check_host(host, allow_remote)
        self.gateway = gateway
        self.host = host
        self.port: int = sock.getsockname()[1]
        self.start_timeout_s = start_timeout_s
        self._sock = sock
        self._server = uvicorn.Server(
            uvicorn_config(gateway, host, self.port, log_level, reload=reload)
        )
        self._thread: threading.Thread | None = None

    def start(self) -> GatewayServer:
        """Start serving; returns once the socket accepts connections."""
        if self._thread is not None:
            raise RuntimeError("the server was already started")
        self._thread = threading.Thread(
            target=self._server.run, args=([self._sock],), name="turnrl-serve-http", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the gateway server failed to start on {self.url}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the gateway server did not start in {self.start_timeout_s} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask uvicorn to exit and wait for the thread (closes the socket)."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        else:
            self._sock.close()

    def __enter__(self) -> GatewayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://HOST:PORT``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def base_url(self, rollout_id: str | None = None, task_id: str | None = None) -> str:
        """The OpenAI ``base_url`` for a rollout (ids in the path), or the bare ``/v1``."""
        prefix = ""
        if task_id is not None:
            if rollout_id is None:
                raise ValueError("a task id needs a rollout id")
            prefix += f"/tasks/{quote(task_id, safe='')}"
        if rollout_id is not None:
            prefix += f"/rollouts/{quote(rollout_id, safe='')}"
        return f"{self.url}{prefix}/v1"

    def endpoint(self, rollout_id: str, task_id: str | None = None) -> RolloutEndpoint:
        """The URLs of one rollout (see :class:`RolloutEndpoint`); registers nothing."""
        rid = quote(rollout_id, safe="")
        agl = f"{self.url}/proxy/rollout/{rid}/attempt/a0/mode/train/openai/v1"
        return RolloutEndpoint(
            rollout_id=rollout_id,
            task_id=task_id,
            base_url=self.base_url(rollout_id, task_id),
            reward_url=f"{self.url}/v1/rollouts/{rid}/reward",
            agl_base_url=agl,
            event_url=f"{self.url}/api/rollouts/{rid}/attempt/a0/events",
        )

    def open_rollout(self, rollout_id: str, task_id: str | None = None) -> RolloutEndpoint:
        """Register a rollout with the gateway (task id fixed, timeout clock started)
        and return its endpoint."""
        self.gateway.open_rollout(rollout_id, task_id)
        return self.endpoint(rollout_id, task_id)
