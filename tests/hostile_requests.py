"""Misbehaving clients and agents for the gateway's trust-model tests.

Clients: a web page in the user's browser (DNS rebinding, ``Origin``,
``text/plain`` POSTs), a local process without the key or with a wrong one,
slow senders (half the headers, a short body), malformed bodies. Agents (used
as ``agent.entrypoint = "<this file>:NAME"``): one that calls rollouts the loop
has not opened, one that posts a reward to a sibling's URL, one that posts two
different rewards, one that posts one reward and returns another, one whose only
call the gateway refuses. Every agent logs what the gateway answered it to
``$TURNRL_TEST_LOG`` (one JSON line per attempt) so tests can assert on it.

Only the standard library is imported here: command agents start fast.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

# --------------------------------------------------------------------------- HTTP


@dataclass(frozen=True)
class Answer:
    """What the gateway answered: status, the decoded JSON body, the raw text."""

    status: int
    body: Any
    text: str

    @property
    def message(self) -> str:
        return str(self.body.get("error", {}).get("message", "")) if self.body else ""

    @property
    def param(self) -> str | None:
        return self.body.get("error", {}).get("param") if isinstance(self.body, dict) else None


def send(
    url: str,
    *,
    method: str = "POST",
    body: bytes | None = None,
    key: str | None = None,
    headers: dict[str, str] | None = None,
    content_type: str | None = "application/json",
    timeout: float = 30.0,
) -> Answer:
    """One request to ``url`` with exactly the headers given (``Host`` included, when
    set in ``headers``); ``key`` goes in ``Authorization: Bearer``."""
    parts = urlsplit(url)
    sent: dict[str, str] = {}
    if key is not None:
        sent["Authorization"] = f"Bearer {key}"
    if content_type is not None and body is not None:
        sent["Content-Type"] = content_type
    sent.update(headers or {})
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        if "Host" in sent:
            connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in sent.items():
                connection.putheader(name, value)
            if body is not None:
                connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body)
        else:
            connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        text = response.read().decode("utf-8", "replace")
    finally:
        connection.close()
    try:
        decoded = json.loads(text) if text else None
    except json.JSONDecodeError:
        decoded = None
    return Answer(response.status, decoded, text)


def chat_json(messages: Any = None, **fields: Any) -> bytes:
    """A chat completion body (``messages`` default: one user message)."""
    if messages is None:
        messages = [{"role": "user", "content": "hi"}]
    return json.dumps({"model": "m", "messages": messages, "max_tokens": 4, **fields}).encode()


def reward_json(value: float) -> bytes:
    return json.dumps({"reward": value}).encode()


# ------------------------------------------------------------------ a web page


def rebinding_page_reload(base: str, policy_dir: str) -> Answer:
    """What a page at ``http://evil.example`` whose name now resolves to 127.0.0.1
    sends with ``fetch(..., {method: "POST", body})``: its own ``Host``, its
    ``Origin``, ``text/plain`` (no CORS preflight), no key."""
    return send(
        f"{base}/admin/reload",
        body=json.dumps({"policy": policy_dir}).encode(),
        content_type="text/plain;charset=UTF-8",
        headers={
            "Host": "evil.example:8000",
            "Origin": "http://evil.example:8000",
            "Sec-Fetch-Site": "same-origin",
        },
    )


def browser_post(base: str, path: str, key: str, *, site: str = "cross-site") -> Answer:
    """A page that somehow holds the key still cannot use it from a browser: its
    requests carry ``Origin`` and ``Sec-Fetch-Site``."""
    return send(
        f"{base}{path}",
        body=chat_json(),
        key=key,
        headers={"Origin": "http://localhost:3000", "Sec-Fetch-Site": site},
    )


def form_post(base: str, path: str, key: str) -> Answer:
    """A key holder's POST as a form (what a page's ``<form>`` would send)."""
    return send(
        f"{base}{path}",
        body=b"policy=/tmp/evil",
        key=key,
        content_type="application/x-www-form-urlencoded",
    )


# ---------------------------------------------------------------- slow senders


def _connect(host: str, port: int) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=5)
    sock.settimeout(None)
    return sock


def _read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, bool]:
    """Everything the server sends until it closes (True) or ``limit_s`` passes (False)."""
    sock.settimeout(limit_s)
    received = b""
    deadline = time.monotonic() + limit_s
    try:
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                return received, True
            received += chunk
    except TimeoutError:
        return received, False
    except ConnectionResetError:
        return received, True
    return received, False


def half_headers(host: str, port: int, key: str, limit_s: float) -> tuple[bytes, bool]:
    """Send half a request head and stop: what came back and whether the server closed
    the connection within ``limit_s``."""
    with _connect(host, port) as sock:
        sock.sendall(
            b"POST /rollouts/slow/v1/chat/completions HTTP/1.1\r\n"
            + f"Host: {host}:{port}\r\nAuthorization: Bearer {key}\r\n".encode()
        )
        return _read_until_closed(sock, limit_s)


def short_body(host: str, port: int, key: str, limit_s: float) -> tuple[bytes, bool]:
    """Promise 1,000 body bytes, send 10 and stop (as :func:`half_headers`)."""
    with _connect(host, port) as sock:
        sock.sendall(
            b"POST /rollouts/slow-body/v1/chat/completions HTTP/1.1\r\n"
            + f"Host: {host}:{port}\r\nAuthorization: Bearer {key}\r\n".encode()
            + b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            + b'{"model": '
        )
        return _read_until_closed(sock, limit_s)


# ------------------------------------------------------------------- agents

_ROLLOUT = re.compile(r"/rollouts/([^/]+)/secret/([^/]+)/v1$")


def _log(entry: dict[str, Any]) -> None:
    path = os.environ.get("TURNRL_TEST_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")


def _server(llm: Any) -> str:
    parts = urlsplit(llm.base_url)
    return f"{parts.scheme}://{parts.netloc}"


def _own_call(llm: Any) -> str:
    """One ordinary chat call through the rollout's own base URL; the reply text."""
    answer = send(f"{llm.base_url}/chat/completions", body=chat_json(), key=llm.api_key)
    if answer.status != 200:
        raise RuntimeError(f"own call refused: {answer.status} {answer.text}")
    return str(answer.body["choices"][0]["message"]["content"])


def _post_reward(url: str, key: str, value: float) -> Answer:
    return send(url, body=reward_json(value), key=key)


def calls_other_rollouts(task: dict[str, Any], llm: Any) -> float:
    """Before its own work, calls a rollout of a future step (not opened yet) with the
    run's key, and, in a training step, its group sibling (``...-0`` <-> ``...-1``,
    once the loop opened it) with this rollout's own secret, for a turn and a
    reward: the worst a curl from another agent can do. Logs every answer."""
    step, slot, member = llm.rollout_id.split("-")
    future = f"{step[0]}{int(step[1:]) + 5}-{slot}-0"
    attempts = [("future", f"/rollouts/{future}/v1/chat/completions", chat_json())]
    if step.startswith("s"):  # training rollouts come in groups of two here
        sibling = f"{step}-{slot}-{1 - int(member)}"
        secret = _ROLLOUT.search(llm.base_url).group(2)  # type: ignore[union-attr]
        forged = f"/rollouts/{sibling}/secret/{secret}/v1"
        attempts += [
            ("sibling", f"{forged}/chat/completions", chat_json()),
            ("sibling-reward", f"{forged}/reward", reward_json(1.0)),
        ]
    for target, path, body in attempts:
        deadline = time.monotonic() + 10
        while True:  # a sibling may not be opened yet (404): wait for it
            answer = send(f"{_server(llm)}{path}", body=body, key=llm.api_key)
            if target == "future" or answer.status != 404 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        _log({"rollout": llm.rollout_id, "target": target, "status": answer.status})
    _own_call(llm)
    return 0.5


def posts_to_sibling(task: dict[str, Any], llm: Any) -> float:
    """Posts reward 1.0 to the sibling's reward URL (its own secret in it), then does
    its own work and returns 0.25."""
    _own_call(llm)
    index = int(llm.rollout_id[1:])
    sibling = f"r{index ^ 1}"
    url = llm.reward_url.replace(f"/rollouts/{llm.rollout_id}/", f"/rollouts/{sibling}/")
    answer = _post_reward(url, llm.api_key, 1.0)
    _log({"rollout": llm.rollout_id, "status": answer.status, "message": answer.message})
    return 0.25


def posts_two_rewards(task: dict[str, Any], llm: Any) -> None:
    """Posts 1.0, then 0.0 (the second is refused with a 409, which it ignores)."""
    _own_call(llm)
    for value in (1.0, 0.0):
        answer = _post_reward(llm.reward_url, llm.api_key, value)
        _log({"rollout": llm.rollout_id, "reward": value, "status": answer.status})


def posts_and_returns_another(task: dict[str, Any], llm: Any) -> float:
    """Posts 1.0 and returns 0.0."""
    _own_call(llm)
    answer = _post_reward(llm.reward_url, llm.api_key, 1.0)
    _log({"rollout": llm.rollout_id, "status": answer.status})
    return 0.0


def only_call_refused(task: dict[str, Any], llm: Any) -> float:
    """Its only call has ``"role": []`` (a 400), which it swallows, and returns 1.0."""
    answer = send(
        f"{llm.base_url}/chat/completions",
        body=chat_json([{"role": [], "content": "hi"}]),
        key=llm.api_key,
    )
    _log({"rollout": llm.rollout_id, "status": answer.status, "param": answer.param})
    return 1.0


def without_key(task: dict[str, Any], llm: Any) -> float:
    """Calls with no key and with a wrong one (both refused), then with the right one."""
    for key in (None, "x" * 43):
        answer = send(f"{llm.base_url}/chat/completions", body=chat_json(), key=key)
        _log({"rollout": llm.rollout_id, "key": key is not None, "status": answer.status})
    _own_call(llm)
    return 1.0


# ------------------------------------------------------------- remote agents


def key_checks(server: str, key: str) -> list[tuple[str, int]]:
    """What a remote agent sees: a call without the key, with a wrong one, with the right
    one, then its reward; ``(what, status)`` of each."""
    chat = f"{server}/rollouts/remote-1/v1/chat/completions"
    out = [
        ("no key", send(chat, body=chat_json()).status),
        ("wrong key", send(chat, body=chat_json(), key=key[::-1]).status),
        ("right key", send(chat, body=chat_json(), key=key).status),
    ]
    reward = send(f"{server}/rollouts/remote-1/v1/reward", body=reward_json(1.0), key=key)
    out.append(("reward", reward.status))
    return out


if __name__ == "__main__":  # python hostile_requests.py key-checks URL KEY (in another netns)
    import sys

    if sys.argv[1:2] == ["key-checks"]:
        print(json.dumps(key_checks(sys.argv[2], sys.argv[3])))
