"""A deadline on reading each request: half-sent headers or a short body cannot hold a
connection open.

uvicorn times out idle keep-alive connections (``timeout_keep_alive``) but puts
no limit on how long a client may take to send a request: a connection that
sends half its headers, or fewer body bytes than its ``Content-Length``, stays
open forever (slowloris). :func:`request_deadline_protocol` makes a subclass of
uvicorn's h11 protocol (``uvicorn.Config(http=...)``) that gives every request
``timeout_s`` from the moment the connection is ready for it (connected, or the
previous response sent) until its last body byte arrived. Past it, a client
still sending headers gets a 408 and the connection is closed; one still
sending its body is disconnected (the app's body read then ends; nothing is
recorded). A request that has fully arrived is never timed out here: sampling
may take as long as it takes.

The subclass reads uvicorn's per-connection state (``conn``, ``transport``,
``loop``) and hooks ``connection_made``, ``data_received`` and
``on_response_complete``: uvicorn is pinned (pyproject.toml) for this reason,
and ``tests/test_hostile_gateway.py`` checks the behaviour on every upgrade.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from turnrl.serve.errors import error_body
from turnrl.serve.guard import REQUEST_TIMEOUT_S

__all__ = ["REQUEST_TIMEOUT_S", "RequestDeadlineProtocol", "request_deadline_protocol"]


def _timeout_response(timeout_s: float) -> bytes:
    body = json.dumps(
        error_body(408, f"the request did not arrive within {timeout_s:g} s; closing")
    ).encode()
    head = (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body)
    )
    return head + body


class RequestDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on receiving each request (see module)."""

    request_timeout_s: float = REQUEST_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout_s, self._on_deadline)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _request_arrived(self) -> bool:
        return self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._deadline is not None and self._request_arrived():
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self._request_arrived():
            self._arm()  # the next request (or the rest of this one) has its own deadline

    def _on_deadline(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self._request_arrived():
            return
        if self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE:
            # Still sending headers: nothing was answered on this request yet.
            self.transport.write(_timeout_response(self.request_timeout_s))
        self.transport.close()


def request_deadline_protocol(timeout_s: float) -> type[RequestDeadlineProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with ``timeout_s`` per request."""
    if not timeout_s > 0:
        raise ValueError(f"request timeout must be > 0 seconds, got {timeout_s}")
    return type(
        "RequestDeadlineProtocol", (RequestDeadlineProtocol,), {"request_timeout_s": timeout_s}
    )
