"""Remote agents reach ``turnrl serve`` with the key, and only with it.

An agent on another machine is simulated by another network namespace: two
namespaces joined by a veth pair, with addresses from 198.18.0.0/15 (the
benchmarking range, RFC 2544) that exist only inside the namespaces this test
creates and deletes. ``turnrl serve`` runs in one, bound to its address with
``--api-key-file``; the agent runs ``hostile_requests.py key-checks`` in the
other: no key and a wrong key are refused (401), the right key works. Where
namespaces cannot be made (not root, no ``ip``), that test is skipped with the
reason; the same checks then still run against a wildcard (non-loopback) bind
in this namespace, which always runs. Everything is bounded in time, and the
server process and namespaces are removed whatever happens.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from turnrl.cli import main

HOSTILE = Path(__file__).with_name("hostile_requests.py")
SERVER_ADDRESS, AGENT_ADDRESS = "198.18.213.1", "198.18.213.2"
START_TIMEOUT_S = 180.0
EXPECTED = [["no key", 401], ["wrong key", 401], ["right key", 200], ["reward", 200]]


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=True)


@pytest.fixture
def namespaces() -> Iterator[tuple[list[str], list[str]]]:
    """``(server prefix, agent prefix)``: the command prefixes that run in each namespace."""
    if shutil.which("ip") is None:
        pytest.skip("no 'ip' command (iproute2): cannot make network namespaces")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add); the wildcard-bind test runs")
    tag = f"{os.getpid() % 100000}"
    server_ns, agent_ns = f"turnrl-gw-{tag}", f"turnrl-ag-{tag}"
    server_if, agent_if = f"trlgw{tag}", f"trlag{tag}"
    try:
        _ip("netns", "add", server_ns)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"ip netns add is not permitted here: {exc.stderr.strip()}")
    try:
        _ip("netns", "add", agent_ns)
        _ip("link", "add", server_if, "type", "veth", "peer", "name", agent_if)
        for ns, interface, address in (
            (server_ns, server_if, SERVER_ADDRESS),
            (agent_ns, agent_if, AGENT_ADDRESS),
        ):
            _ip("link", "set", interface, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{address}/30", "dev", interface)
            _ip("-n", ns, "link", "set", interface, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield ["ip", "netns", "exec", server_ns], ["ip", "netns", "exec", agent_ns]
    finally:
        for ns in (server_ns, agent_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        subprocess.run(["ip", "link", "del", server_if], capture_output=True, timeout=20)
        names = _ip("netns", "list").stdout
        assert server_ns not in names and agent_ns not in names


class Serve:
    """``turnrl serve`` in a child process (under ``prefix``), stopped on exit."""

    def __init__(self, prefix: list[str], host: str, key_file: Path) -> None:
        command = [*prefix, sys.executable, "-m", "turnrl.cli", "serve", "--host", host]
        command += ["--port", "0", "--api-key-file", str(key_file), "--log-level", "warning"]
        env = {k: v for k, v in os.environ.items() if k != "TURNRL_API_KEY"}
        self.child = subprocess.Popen(
            command, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.child.stderr is not None
        for line in self.child.stderr:
            self.lines.put(line)
        self.lines.put("")

    def port(self) -> int:
        """The port, from the start-up lines (waits for the key line too)."""
        port = None
        while True:
            line = self.lines.get(timeout=START_TIMEOUT_S)
            assert line, f"turnrl serve exited with {self.child.wait(5)} before serving"
            if line.startswith("turnrl serve: http://"):
                port = int(line.split(":")[3].split("/")[0])
            if line.startswith("turnrl serve: API key") and port is not None:
                assert "from " in line  # the key was read from the file, not printed
                return port

    def __enter__(self) -> Serve:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.child.poll() is None:
            os.killpg(self.child.pid, signal.SIGINT)
            try:
                self.child.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.child.pid, signal.SIGKILL)
                self.child.wait(10)


def _key_checks(prefix: list[str], url: str, key: str) -> list[list[object]]:
    done = subprocess.run(
        [*prefix, sys.executable, str(HOSTILE), "key-checks", url, key],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_an_agent_in_another_network_namespace_needs_the_key(
    namespaces: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """The server's address without a key is refused before any bind
    (test_serve_refuses_a_remote_bind_without_a_key_and_short_keys); with the key file,
    served, and only the right key gets through from the other namespace."""
    server_prefix, agent_prefix = namespaces
    key_file = tmp_path / "key"
    with Serve(server_prefix, SERVER_ADDRESS, key_file) as serve:
        port = serve.port()
        key = key_file.read_text().strip()
        assert oct(key_file.stat().st_mode & 0o777) == "0o600"
        checks = _key_checks(agent_prefix, f"http://{SERVER_ADDRESS}:{port}", key)
    assert checks == EXPECTED


def _non_loopback_address() -> str:
    """This machine's address on its default route, else 127.0.0.1 (no network at all)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # UDP: picks a route, sends nothing
        address = probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()
    return address


def test_a_wildcard_bind_needs_the_key_from_any_address(tmp_path: Path) -> None:
    """The same checks without namespaces: ``--host 0.0.0.0`` reached through this
    machine's own non-loopback address (always runs)."""
    key_file = tmp_path / "key"
    key_file.write_text("a-key-of-my-own-" + "x" * 20 + "\n")
    with Serve([], "0.0.0.0", key_file) as serve:
        port = serve.port()
        checks = _key_checks(
            [], f"http://{_non_loopback_address()}:{port}", key_file.read_text().strip()
        )
    assert checks == EXPECTED


def test_serve_refuses_a_remote_bind_without_a_key_and_short_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TURNRL_API_KEY", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "turnrl serve: error: --host/--port: refusing to bind the gateway to '0.0.0.0' "
        "without an API key of your own"
    )
    # A named non-loopback address too (the namespaced test's server address), refused
    # before any bind: the address need not exist here.
    assert main(["serve", "--host", SERVER_ADDRESS, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert f"refusing to bind the gateway to '{SERVER_ADDRESS}' without an API key" in err
    monkeypatch.setenv("TURNRL_API_KEY", "short")
    assert main(["serve", "--port", "0"]) == 2
    assert capsys.readouterr().err.startswith(
        "turnrl serve: error: TURNRL_API_KEY: the API key must be at least 16 printable "
        "characters without spaces"
    )
    empty = tmp_path / "empty"
    empty.write_text("")
    monkeypatch.delenv("TURNRL_API_KEY")
    assert main(["serve", "--port", "0", "--api-key-file", str(empty)]) == 2
    assert f"--api-key-file {empty}: the API key must be" in capsys.readouterr().err
    assert main(["serve", "--port", "0", "--idle-timeout", "0"]) == 2
    assert "--idle-timeout must be > 0 seconds, got 0.0" in capsys.readouterr().err


def test_serve_limits_are_on_by_default() -> None:
    import argparse

    from turnrl.serve.cli import add_serve_command, gateway_config

    parser = argparse.ArgumentParser()
    add_serve_command(parser.add_subparsers())
    args = parser.parse_args(["serve"])
    assert (args.idle_timeout, args.request_timeout, args.rollout_timeout) == (600.0, 30.0, None)
    assert gateway_config(args).idle_timeout_s == 600.0
