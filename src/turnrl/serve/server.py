"""Run the gateway app with uvicorn: in a background thread, or in the foreground.

:class:`GatewayServer` is what tests and in-process trainers use: it starts
uvicorn in a daemon thread on a free port (``port=0``), waits until it
accepts connections, and gives the ``base_url`` to hand to an OpenAI client.

The gateway has no authentication, so it binds to loopback addresses only
unless ``allow_remote=True`` is passed explicitly.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from urllib.parse import quote

import uvicorn

from turnrl.serve.app import create_app
from turnrl.serve.gateway import Gateway


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback IP address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_host(host: str, allow_remote: bool) -> None:
    """Refuse a non-loopback bind address unless explicitly allowed."""
    if not allow_remote and not is_loopback(host):
        raise ValueError(
            f"refusing to bind the unauthenticated gateway to {host!r}; use a loopback "
            "address (127.0.0.1) or pass allow_remote=True / --allow-remote"
        )


def uvicorn_config(gateway: Gateway, host: str, port: int, log_level: str) -> uvicorn.Config:
    """The uvicorn configuration shared by the thread and foreground servers."""
    return uvicorn.Config(
        create_app(gateway),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        lifespan="off",
    )


class GatewayServer:
    """Serve a :class:`Gateway` over HTTP from a background thread.

    Use as a context manager::

        with Gateway(policy) as gateway, GatewayServer(gateway) as server:
            client = openai.OpenAI(base_url=server.base_url("rollout-1"), api_key="-")
    """

    def __init__(
        self,
        gateway: Gateway,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        allow_remote: bool = False,
        log_level: str = "warning",
        start_timeout_s: float = 30.0,
    ) -> None:
        check_host(host, allow_remote)
        self.gateway = gateway
        self.host = host
        self.port = port
        self.start_timeout_s = start_timeout_s
        self._server = uvicorn.Server(uvicorn_config(gateway, host, port, log_level))
        self._thread: threading.Thread | None = None

    def start(self) -> GatewayServer:
        """Start serving; returns once the socket accepts connections."""
        if self._thread is not None:
            raise RuntimeError("the server was already started")
        self._thread = threading.Thread(
            target=self._server.run, name="turnrl-serve-http", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the gateway server failed to start on {self.host}:{self.port}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the gateway server did not start in {self.start_timeout_s} s")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask uvicorn to exit and wait for the thread."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)

    def __enter__(self) -> GatewayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (valid after :meth:`start`)."""
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
