"""Binding the gateway's listening socket: loopback by default, clear errors early.

:func:`bind_socket` binds before any expensive work (loading a model), so a busy
or invalid port fails at once with a message naming the address, and the bound
socket is then handed to the server (no window in which another process could
take the port). The gateway has no authentication, so it binds only to loopback
addresses unless remote binding is allowed explicitly.
"""

from __future__ import annotations

import errno
import ipaddress
import socket

LISTEN_BACKLOG = 2048
"""Pending connections the socket queues (uvicorn's default)."""


class BindError(ValueError):
    """The host or port cannot be bound (the message says which and why)."""


class PortInUseError(BindError):
    """The address is already in use (another server listens there)."""


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
        raise BindError(
            f"refusing to bind the unauthenticated gateway to {host!r}; use a loopback "
            "address (127.0.0.1) or pass allow_remote=True / --allow-remote"
        )


def check_port(port: int) -> int:
    """A TCP port number: 0 (any free port) to 65535."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise BindError(f"port must be 0 (any free port) to 65535, got {port!r}")
    return port


def bind_socket(host: str, port: int, *, allow_remote: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port=0``: a free port) and listening
    (connections wait in the backlog until the server runs).

    Raises :class:`PortInUseError` when another process holds the port and
    :class:`BindError` for other failures (bad host, no permission).
    """
    check_host(host, allow_remote)
    check_port(port)
    bare = host.strip("[]")
    try:
        infos = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise BindError(f"cannot resolve host {host!r}: {exc.strerror}") from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(
                f"{host}:{port} is already in use (another server is listening there); "
                "choose another port, or 0 for any free one"
            ) from exc
        raise BindError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from exc
    return sock
