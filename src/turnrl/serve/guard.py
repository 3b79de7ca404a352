"""Who may talk to the gateway: the run's key, no browsers, no foreign ``Host``, JSON only.

Every gateway (``turnrl serve`` and the agent loop's) has a key, made with
:func:`new_api_key` unless the user gives one. :class:`RequestGuard` wraps the
ASGI app and refuses, before any route runs, in this order:

1. a ``Host`` header that names none of the gateway's own addresses (400): a
   web page that rebinds its DNS name to 127.0.0.1 sends its own name there;
2. a request a browser made for a web page (403): it carries an ``Origin``
   header, or ``Sec-Fetch-Site`` other than ``none`` (an address typed by the
   user). Agents are programs, not pages: no agent client sends either;
3. a missing or wrong key (401): ``Authorization: Bearer KEY`` (what every
   OpenAI client sends as its ``api_key``), compared in constant time;
4. a ``POST`` whose ``Content-Type`` is not JSON (415): a page can send
   ``text/plain`` or a form without a CORS preflight, never ``application/json``.

The answers are the gateway's OpenAI-style JSON errors. See ``docs/gateway.md``
("Trust model").
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from turnrl.serve.errors import error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

API_KEY_BYTES = 32
"""Random bytes in a generated key (``secrets.token_urlsafe``: 43 characters)."""

MIN_API_KEY_CHARS = 16
"""Shortest key a user may give (a short one can be guessed over the network)."""

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
"""``Host`` names that always mean this machine."""

REQUEST_TIMEOUT_S = 30.0
"""Default time a client has to send one whole request, headers and body
(:mod:`turnrl.serve.slowclients` enforces it)."""

JSON_TYPES = ("application/json",)
"""``Content-Type`` media types a POST may carry (``application/*+json`` too)."""


def new_api_key() -> str:
    """A fresh random key for one run (``secrets``-made, URL-safe)."""
    return secrets.token_urlsafe(API_KEY_BYTES)


def check_api_key(key: str, where: str) -> str:
    """A user-given key: printable, no spaces, at least :data:`MIN_API_KEY_CHARS` long
    (``where`` names its source in the error)."""
    if len(key) < MIN_API_KEY_CHARS or not key.isprintable() or any(c.isspace() for c in key):
        raise ValueError(
            f"{where}: the API key must be at least {MIN_API_KEY_CHARS} printable characters "
            "without spaces (make one with: python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))')"
        )
    return key


def is_wildcard(host: str) -> bool:
    """Whether ``host`` is an any-address bind (``0.0.0.0``, ``::``, ``""``)."""
    if host in ("", "*"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def allowed_host_names(bind_host: str, extra: Iterable[str] = ()) -> frozenset[str] | None:
    """The ``Host`` names a gateway bound to ``bind_host`` answers: the loopback names,
    the bind address and ``extra`` (``--allowed-host``: a proxy's public name).
    ``None`` (any name) for a wildcard bind without ``extra``: its names are not
    known, and the key is what keeps others out."""
    extra = tuple(extra)
    if is_wildcard(bind_host) and not extra:
        return None
    names = {*LOOPBACK_NAMES, *extra}
    if not is_wildcard(bind_host):
        names.add(bind_host.strip("[]"))
    return frozenset(name.lower() for name in names)


def host_name(header: str) -> str:
    """The name of a ``Host`` header value, without its port (``[::1]:80`` -> ``::1``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media in JSON_TYPES or (media.startswith("application/") and media.endswith("+json"))


class RequestGuard:
    """ASGI middleware refusing foreign hosts, browser requests, bad keys and non-JSON POSTs.

    ``allowed_hosts`` is from :func:`allowed_host_names` (``None``: any ``Host``).
    """

    def __init__(self, app: ASGIApp, *, api_key: str, allowed_hosts: frozenset[str] | None):
        if not api_key:
            raise ValueError("the gateway needs an API key")
        self.app = app
        self.allowed_hosts = allowed_hosts
        self._expected = f"Bearer {api_key}".encode()

    def refusal(self, scope: Scope) -> tuple[int, str, str | None] | None:
        """``(status, message, param)`` when the request must be refused, else ``None``."""
        headers: dict[bytes, bytes] = {}
        for key, value in scope.get("headers", ()):
            headers.setdefault(key.lower(), value)
        host = headers.get(b"host", b"").decode("latin-1")
        if self.allowed_hosts is not None and host_name(host) not in self.allowed_hosts:
            return (
                400,
                f"Host {host!r} is not this gateway (DNS rebinding?); it answers "
                f"{', '.join(sorted(self.allowed_hosts))}",
                "Host",
            )
        site = headers.get(b"sec-fetch-site", b"none").decode("latin-1").lower()
        if b"origin" in headers or site != "none":
            return (
                403,
                "browser requests are refused: the gateway serves agent programs, not web "
                "pages (the request has an Origin or Sec-Fetch-Site header)",
                "Origin" if b"origin" in headers else "Sec-Fetch-Site",
            )
        given = headers.get(b"authorization", b"")
        if not hmac.compare_digest(given, self._expected):
            what = "no API key" if not given else "a wrong API key"
            return (
                401,
                f"{what}: send the run's key as 'Authorization: Bearer KEY' (the OpenAI "
                "client's api_key; agents get it as OPENAI_API_KEY and AGL_KEY)",
                "Authorization",
            )
        if scope.get("method") == "POST":
            content_type = headers.get(b"content-type", b"").decode("latin-1")
            if not _is_json(content_type):
                return (
                    415,
                    f"Content-Type must be application/json, got {content_type or 'none'!r}",
                    "Content-Type",
                )
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = self.refusal(scope)
        if refused is None:
            await self.app(scope, receive, send)
            return
        status, message, param = refused
        body = json.dumps(error_body(status, message, param=param)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        if status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="turnrl"'))
        # Refused before its body is read: close the connection after the answer.
        headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
