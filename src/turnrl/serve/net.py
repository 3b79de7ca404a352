"""Binding the gateway's listening socket: loopback by default, clear errors early.

:func:`bind_socket` binds before any expensive work (loading a model), so a busy
or invalid port fails at once with a message naming the address, and the bound
socket is then handed to the server (no window in which another process could
take the port). Every gateway checks a key (:mod:`turnrl.serve.guard`); it binds
beyond loopback only when the user gave that key (so they can hand it to remote
agents, and did not leave the choice to a generated one nobody will see).
"""

from __future__ import annotations

import errno
import ipaddress
import socket

from turnrl.errors import UsageError

LISTEN_BACKLOG = 2048
"""Pending connections the socket queues (uvicorn's default)."""


class BindError(UsageError):
    """The host or port cannot be bound (the message says which and why): bad input a
    user fixes, so ``turnrl`` prints it as one line (exit code 2)."""


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


def check_host(host: str, keyed: bool) -> None:
    """Refuse a non-loopback bind address unless the user gave the gateway a key."""
    if not keyed and not is_loopback(host):
        raise BindError(
            f"refusing to bind the gateway to {host!r} without an API key of your own: "
            "remote agents need the key, and nothing else keeps other machines out; "
            "give one (turnrl serve --api-key-file FILE or TURNRL_API_KEY; "
            "GatewayServer(api_key=...)) or bind a loopback address (127.0.0.1)"
        )


def check_port(port: int) -> int:
    """A TCP port number: 0 (any free port) to 65535."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise BindError(f"port must be 0 (any free port) to 65535, got {port!r}")
    return port


def bind_socket(host: str, port: int, *, keyed: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port=0``: a free port) and listening
    (connections wait in the backlog until the server runs).

    Raises :class:`PortInUseError` when another process holds the port and
    :class:`BindError` for other failures (bad host, no permission, a non-loopback
    host when not ``keyed``: the user gave no key).
    """
    check_host(host, keyed)
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
