"""Run the gateway app with uvicorn: in a background thread, or in the foreground.

:class:`GatewayServer` is what tests and in-process trainers use: it serves on a
socket bound up front (:func:`~turnrl.serve.net.bind_socket`, ``port=0`` for a
free port) from a thread, waits until it accepts connections, and hands out
per-rollout endpoints (:class:`RolloutEndpoint`) for OpenAI clients and agent
subprocesses. :meth:`GatewayServer.stop` joins the thread; with
:meth:`Gateway.close <turnrl.serve.gateway.Gateway.close>` nothing keeps running.

Every server checks a key (``api_key``, generated when not given;
:mod:`turnrl.serve.guard`), refuses browser requests and foreign ``Host``
headers, and gives each request :data:`~turnrl.serve.slowclients.REQUEST_TIMEOUT_S`
to arrive (:mod:`turnrl.serve.slowclients`). It binds beyond loopback only
with a key the caller gave. A rollout opened here gets its own secret, which its
URLs carry: another agent of the run cannot add turns or a reward to it.
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
from turnrl.serve.guard import RequestGuard, allowed_host_names, new_api_key
from turnrl.serve.net import bind_socket, check_host, is_loopback
from turnrl.serve.slowclients import REQUEST_TIMEOUT_S, request_deadline_protocol

__all__ = ["GatewayServer", "RolloutEndpoint", "check_host", "is_loopback", "uvicorn_config"]

KEEP_ALIVE_S = 5
"""An idle keep-alive connection is closed after this many seconds (uvicorn's default)."""


def uvicorn_config(
    gateway: Gateway,
    host: str,
    port: int,
    log_level: str,
    *,
    api_key: str,
    reload: Any = None,
    allowed_hosts: tuple[str, ...] = (),
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    list_rollouts: bool = True,
) -> uvicorn.Config:
    """The uvicorn configuration shared by the thread and foreground servers: the app
    behind the :class:`~turnrl.serve.guard.RequestGuard`, the request deadline."""
    app = RequestGuard(
        create_app(gateway, reload=reload, list_rollouts=list_rollouts),
        api_key=api_key,
        allowed_hosts=allowed_host_names(host, allowed_hosts),
    )
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        lifespan="off",
        http=request_deadline_protocol(request_timeout_s),
        timeout_keep_alive=KEEP_ALIVE_S,
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
    api_key: str
    """The server's key (``Authorization: Bearer``; the OpenAI client's ``api_key``)."""
    secret: str | None = None
    """The rollout's own secret (in every URL above), when it was opened here."""

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
            endpoint = server.open_rollout("rollout-1")
            client = openai.OpenAI(base_url=endpoint.base_url, api_key=server.api_key)

    Pass ``sock`` (from :func:`~turnrl.serve.net.bind_socket`) to bind before
    loading a model; otherwise ``host``/``port`` are bound here, and a busy port
    raises :class:`~turnrl.serve.net.PortInUseError` at once. ``api_key``: the key
    clients must send (a fresh one when ``None``, as :attr:`api_key`); a
    non-loopback host needs one given here. ``allowed_hosts``: further ``Host``
    names to answer (a proxy's). ``list_rollouts=False`` removes
    ``GET /v1/rollouts`` (the agent loop: agents must not learn each other's ids).
    """

    def __init__(
        self,
        gateway: Gateway,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        sock: socket.socket | None = None,
        api_key: str | None = None,
        allowed_hosts: tuple[str, ...] = (),
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        list_rollouts: bool = True,
        log_level: str = "warning",
        start_timeout_s: float = 30.0,
        reload: Any = None,
    ) -> None:
        keyed = api_key is not None
        if sock is None:
            sock = bind_socket(host, port, keyed=keyed)
        else:
            host = sock.getsockname()[0]
            check_host(host, keyed)
        self.gateway = gateway
        self.host = host
        self.port: int = sock.getsockname()[1]
        self.api_key: str = api_key if api_key is not None else new_api_key()
        """The key every request must carry (``Authorization: Bearer``)."""
        self.start_timeout_s = start_timeout_s
        self._sock = sock
        self._server = uvicorn.Server(
            uvicorn_config(
                gateway,
                host,
                self.port,
                log_level,
                api_key=self.api_key,
                reload=reload,
                allowed_hosts=allowed_hosts,
                request_timeout_s=request_timeout_s,
                list_rollouts=list_rollouts,
            )
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

    def base_url(
        self,
        rollout_id: str | None = None,
        task_id: str | None = None,
        secret: str | None = None,
    ) -> str:
        """The OpenAI ``base_url`` for a rollout (ids, and its secret if any, in the
        path), or the bare ``/v1``."""
        prefix = ""
        if task_id is not None:
            if rollout_id is None:
                raise ValueError("a task id needs a rollout id")
            prefix += f"/tasks/{quote(task_id, safe='')}"
        if rollout_id is not None:
            prefix += f"/rollouts/{quote(rollout_id, safe='')}"
            if secret is not None:
                prefix += f"/secret/{quote(secret, safe='')}"
        elif secret is not None:
            raise ValueError("a rollout secret needs a rollout id")
        return f"{self.url}{prefix}/v1"

    def endpoint(
        self, rollout_id: str, task_id: str | None = None, secret: str | None = None
    ) -> RolloutEndpoint:
        """The URLs of one rollout (see :class:`RolloutEndpoint`); registers nothing."""
        rid = quote(rollout_id, safe="")
        attempt = "a0" if secret is None else quote(secret, safe="")
        base_url = self.base_url(rollout_id, task_id, secret)
        return RolloutEndpoint(
            rollout_id=rollout_id,
            task_id=task_id,
            base_url=base_url,
            reward_url=f"{base_url}/reward",
            agl_base_url=f"{self.url}/proxy/rollout/{rid}/attempt/{attempt}/mode/train/openai/v1",
            event_url=f"{self.url}/api/rollouts/{rid}/attempt/{attempt}/events",
            api_key=self.api_key,
            secret=secret,
        )

    def open_rollout(self, rollout_id: str, task_id: str | None = None) -> RolloutEndpoint:
        """Register a rollout with the gateway (task id fixed, timeout clock started,
        its secret made) and return its endpoint (the secret in every URL)."""
        secret = self.gateway.open_rollout(rollout_id, task_id)
        return self.endpoint(rollout_id, task_id, secret)
