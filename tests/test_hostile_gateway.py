"""The gateway's trust model against hostile requests and agents (docs/gateway.md).

A web page (DNS rebinding, ``Origin``, ``text/plain``), a local process without
the key, an agent that calls rollouts the loop has not opened or posts rewards
to a sibling's URL or twice, slow senders, abandoned rollouts and malformed
fields. Each test asserts the status and message, what was kept, and that the
gateway (or the run) goes on. The misbehaving clients and agents are in
``tests/hostile_requests.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hostile_requests as hostile
from serve_scripted import ScriptedPolicy, as_json, calculator_reply, chat_body, raw_http
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.serve import (
    BindError,
    Gateway,
    GatewayConfig,
    GatewayError,
    GatewayServer,
    bind_socket,
    parse_chat_request,
)
from turnrl.serve.guard import allowed_host_names, host_name
from turnrl.serve.rollouts import RolloutTable
from turnrl.train.agent.programs import make_program
from turnrl.train.agent.runner import AgentRunner, GatewayLink
from turnrl.types import Task

HOSTILE = Path(__file__).with_name("hostile_requests.py")
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def tiny() -> HFPolicy:
    return build_tiny_policy(seed=0)


class Loader:
    """A policy loader for ``/admin/reload`` that only counts its calls."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.calls: list[str] = []

    def __call__(self, directory: str) -> Any:
        self.calls.append(directory)
        return self.policy


@pytest.fixture
def served(tiny: HFPolicy) -> Iterator[tuple[Gateway, GatewayServer, Loader]]:
    loader = Loader(tiny)
    with (
        Gateway(ScriptedPolicy(tiny, calculator_reply)) as gateway,
        GatewayServer(gateway, reload=loader, request_timeout_s=1.0) as server,
    ):
        yield gateway, server, loader


@pytest.fixture
def loop_served(tiny: HFPolicy) -> Iterator[tuple[Gateway, GatewayServer]]:
    """A gateway as the agent loop runs it: only opened rollouts, no listing."""
    config = GatewayConfig(auto_open=False, default_max_tokens=4)
    with (
        Gateway(ScriptedPolicy(tiny, calculator_reply), config) as gateway,
        GatewayServer(gateway, list_rollouts=False) as server,
    ):
        yield gateway, server


# ----------------------------------------------------------------------------- web pages


def test_a_rebinding_page_cannot_swap_the_served_policy(
    served: tuple[Gateway, GatewayServer, Loader],
) -> None:
    gateway, server, loader = served
    answer = hostile.rebinding_page_reload(server.url, "/tmp/evil-policy")
    assert answer.status == 400
    assert answer.param == "Host"
    assert answer.message.startswith("Host 'evil.example:8000' is not this gateway")
    # Each check stands on its own: a right Host is not enough...
    page = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
    body = json.dumps({"policy": "/tmp/evil-policy"}).encode()
    url = f"{server.url}/admin/reload"
    origin = hostile.send(url, body=body, key=server.api_key, headers=page)
    assert (origin.status, origin.param) == (403, "Origin")
    assert origin.message.startswith("browser requests are refused")
    no_key = hostile.send(url, body=body, content_type="text/plain")
    assert (no_key.status, no_key.param) == (401, "Authorization")
    text = hostile.send(url, body=body, key=server.api_key, content_type="text/plain")
    assert (text.status, text.param) == (415, "Content-Type")
    assert text.message == "Content-Type must be application/json, got 'text/plain'"
    form = hostile.form_post(server.url, "/admin/reload", server.api_key)
    assert form.status == 415
    assert loader.calls == [] and gateway.policy_version == 0
    # ...and the owner's own request, with the key and JSON, goes through.
    ok = hostile.send(url, body=body, key=server.api_key)
    assert ok.status == 200 and loader.calls == ["/tmp/evil-policy"]
    assert gateway.policy_version == 1


@pytest.mark.parametrize(
    "headers, param",
    [
        ({"Origin": "http://localhost:3000"}, "Origin"),
        ({"Sec-Fetch-Site": "cross-site"}, "Sec-Fetch-Site"),
        ({"Sec-Fetch-Site": "same-site"}, "Sec-Fetch-Site"),
        ({"Origin": "null", "Sec-Fetch-Site": "cross-site"}, "Origin"),
    ],
)
def test_browser_requests_are_refused_even_with_the_key(
    served: tuple[Gateway, GatewayServer, Loader], headers: dict[str, str], param: str
) -> None:
    gateway, server, _ = served
    answer = hostile.send(
        f"{server.url}/rollouts/page-1{CHAT}",
        body=hostile.chat_json(),
        key=server.api_key,
        headers=headers,
    )
    assert (answer.status, answer.param) == (403, param)
    assert answer.body["error"]["type"] == "permission_error"
    assert gateway.views.rollouts() == [] and gateway.views.records() == []


def test_the_key_is_required_on_every_route(
    served: tuple[Gateway, GatewayServer, Loader],
) -> None:
    gateway, server, _ = served
    for method, path in [("GET", "/health"), ("GET", "/v1/models"), ("GET", "/v1/rollouts")]:
        answer = hostile.send(f"{server.url}{path}", method=method)
        assert (answer.status, answer.param) == (401, "Authorization"), path
        assert answer.message.startswith("no API key: send the run's key as")
    chat = f"{server.url}/rollouts/k-1{CHAT}"
    wrong = hostile.send(chat, body=hostile.chat_json(), key=server.api_key[:-1] + "x")
    assert wrong.status == 401 and wrong.message.startswith("a wrong API key")
    bare = hostile.send(
        chat, body=hostile.chat_json(), headers={"Authorization": server.api_key}
    )  # no "Bearer"
    assert bare.status == 401
    assert gateway.views.rollouts() == []
    right = hostile.send(chat, body=hostile.chat_json(), key=server.api_key)
    assert right.status == 200 and [r["rollout_id"] for r in gateway.views.rollouts()] == ["k-1"]


def test_each_server_has_its_own_unguessable_key(tiny: HFPolicy) -> None:
    with Gateway(tiny) as gateway, GatewayServer(gateway) as one, GatewayServer(gateway) as two:
        assert one.api_key != two.api_key and len(one.api_key) == 43
        answer = hostile.send(f"{two.url}/health", method="GET", key=one.api_key)
        assert answer.status == 401


def test_host_names_and_the_names_a_gateway_answers() -> None:
    assert host_name("[::1]:8000") == "::1"
    assert host_name("LocalHost:80") == "localhost"
    assert host_name("127.0.0.1") == "127.0.0.1"
    assert host_name("::1") == "::1"
    assert allowed_host_names("127.0.0.1") == frozenset({"localhost", "127.0.0.1", "::1"})
    assert "proxy.example" in (allowed_host_names("127.0.0.1", ["proxy.example"]) or ())
    assert allowed_host_names("10.1.2.3") == frozenset(
        {"localhost", "127.0.0.1", "::1", "10.1.2.3"}
    )
    assert allowed_host_names("0.0.0.0") is None  # any name: the key keeps others out


def test_binding_beyond_loopback_needs_a_key_of_ones_own(tiny: HFPolicy) -> None:
    with pytest.raises(BindError) as refused:
        bind_socket("0.0.0.0", 0)
    assert str(refused.value).startswith(
        "refusing to bind the gateway to '0.0.0.0' without an API key of your own"
    )
    with Gateway(tiny) as gateway:
        with pytest.raises(BindError, match="without an API key"):
            GatewayServer(gateway, host="0.0.0.0")
        with GatewayServer(gateway, host="0.0.0.0", api_key="k" * 20) as server:
            assert server.api_key == "k" * 20


# ----------------------------------------------------------------------------- rollouts


def test_only_opened_rollouts_are_served_and_only_with_their_secret(
    loop_served: tuple[Gateway, GatewayServer],
) -> None:
    gateway, server = loop_served
    key = server.api_key
    future = hostile.send(
        f"{server.url}/rollouts/s2-0000-0{CHAT}", body=hostile.chat_json(), key=key
    )
    assert (future.status, future.body["error"]["code"]) == (404, "rollout_not_open")
    assert future.message == (
        "unknown rollout 's2-0000-0': this gateway serves only the rollouts its training loop "
        "opened"
    )
    assert gateway.stats["open"] == 0  # the call created nothing
    endpoint = server.open_rollout("s1-0000-0", "t")
    other = server.open_rollout("s1-0000-1", "t")
    assert endpoint.secret != other.secret
    for path in (
        f"/rollouts/s1-0000-0{CHAT}",  # no secret
        f"/rollouts/s1-0000-0/secret/{other.secret}{CHAT}",  # a sibling's
        f"/proxy/rollout/s1-0000-0/attempt/a0/mode/train/openai{CHAT}",
    ):
        answer = hostile.send(f"{server.url}{path}", body=hostile.chat_json(), key=key)
        assert (answer.status, answer.body["error"]["code"]) == (403, "wrong_rollout_secret")
    assert gateway.views.rollout("s1-0000-0")["turns"] == 0
    # a forger writes nothing in its report
    assert gateway.registry.problems("s1-0000-0") == ([], [])
    listing = hostile.send(f"{server.url}/v1/rollouts", method="GET", key=key)
    assert listing.status == 404  # agents cannot list each other's ids
    peek = hostile.send(f"{server.url}/v1/rollouts/s1-0000-0", method="GET", key=key)
    assert peek.status == 403
    for base, text in ((endpoint.base_url, "one"), (endpoint.agl_base_url, "two")):
        message = [{"role": "user", "content": text}]  # not a retry of the first
        ok = hostile.send(f"{base}/chat/completions", body=hostile.chat_json(message), key=key)
        assert ok.status == 200, ok.text
    assert gateway.views.rollout("s1-0000-0")["turns"] == 2
    assert gateway.views.rollout("s1-0000-1")["turns"] == 0


def test_a_reward_url_works_only_for_its_own_rollout(
    loop_served: tuple[Gateway, GatewayServer],
) -> None:
    gateway, server = loop_served
    mine = server.open_rollout("r0", "t")
    sibling = server.open_rollout("r1", "t")
    for endpoint in (mine, sibling):
        hostile.send(
            f"{endpoint.base_url}/chat/completions", body=hostile.chat_json(), key=server.api_key
        )
    forged = mine.reward_url.replace("/rollouts/r0/", "/rollouts/r1/")
    answer = hostile.send(forged, body=hostile.reward_json(1.0), key=server.api_key)
    assert (answer.status, answer.body["error"]["code"]) == (403, "wrong_rollout_secret")
    bare = hostile.send(
        f"{server.url}/v1/rollouts/r1/reward", body=hostile.reward_json(1.0), key=server.api_key
    )
    assert bare.status == 403
    event = hostile.send(
        sibling.event_url.replace(sibling.secret or "", mine.secret or ""),
        body=json.dumps({"event_type": "reward", "data": {"value": 1.0}}).encode(),
        key=server.api_key,
    )
    assert event.status == 403
    assert gateway.views.rollout("r1")["finished"] is False
    # Its own URL works once; a second, different reward is refused and remembered.
    first = hostile.send(mine.reward_url, body=hostile.reward_json(1.0), key=server.api_key)
    assert first.status == 200 and first.body["reward"] == 1.0
    again = hostile.send(mine.reward_url, body=hostile.reward_json(1.0), key=server.api_key)
    assert again.status == 200
    second = hostile.send(mine.reward_url, body=hostile.reward_json(0.0), key=server.api_key)
    assert (second.status, second.body["error"]["code"]) == (409, "rollout_finished")
    assert gateway.registry.problems("r0") == ([], [0.0])
    assert gateway.views.rollout("r0")["reward"] == 1.0


# ----------------------------------------------------------------------------- agents


def _tasks(n: int) -> list[Task]:
    return [Task(f"t-{i}", {"task_id": f"t-{i}", "question": f"Q{i}?"}) for i in range(n)]


def _run_agents(
    served: tuple[Gateway, GatewayServer], name: str, n: int, tmp_path: Path, link: Any = None
) -> list[Any]:
    gateway, server = served
    runner = AgentRunner(
        make_program(f"{HOSTILE}:{name}", None),
        link if link is not None else GatewayLink(gateway, server),
        concurrency=n,
        timeout_s=60,
        model="m",
    )
    jobs = [(f"r{i}", task) for i, task in enumerate(_tasks(n))]
    return runner.run(jobs, failure_dir=tmp_path / "failures")


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_agent_cannot_post_its_reward_to_a_sibling(
    loop_served: tuple[Gateway, GatewayServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNRL_TEST_LOG", str(tmp_path / "log.jsonl"))
    results = _run_agents(loop_served, "posts_to_sibling", 2, tmp_path)
    assert [(r.failure, r.reward, len(r.records)) for r in results] == [
        (None, 0.25, 1),
        (None, 0.25, 1),
    ]
    assert sorted(e["status"] for e in _log(tmp_path / "log.jsonl")) == [403, 403]


@pytest.mark.parametrize(
    "agent, reason",
    [
        (
            "posts_two_rewards",
            "the agent posted a second, different reward (0 after 1); a rollout has one reward",
        ),
        (
            "posts_and_returns_another",
            "the agent posted reward 1 and returned 0.0; a rollout has one reward "
            "(post it or return it)",
        ),
    ],
)
def test_a_second_different_reward_is_a_failure_not_an_override(
    loop_served: tuple[Gateway, GatewayServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    agent: str,
    reason: str,
) -> None:
    gateway, _ = loop_served
    monkeypatch.setenv("TURNRL_TEST_LOG", str(tmp_path / "log.jsonl"))
    (result,) = _run_agents(loop_served, agent, 1, tmp_path)
    assert result.failure is not None and result.failure.reason == reason
    assert result.records == []
    assert (
        (tmp_path / "failures" / "r0.txt")
        .read_text()
        .startswith(
            f"rollout: r0\ntask: t-0\nagent: entrypoint {HOSTILE}:{agent}\nfailure: {reason}\n"
        )
    )
    assert gateway.stats["discarded"] == 1 and gateway.views.pop_finished_rollouts() == []


def test_a_refused_only_call_is_the_failure_reason(
    loop_served: tuple[Gateway, GatewayServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNRL_TEST_LOG", str(tmp_path / "log.jsonl"))
    (result,) = _run_agents(loop_served, "only_call_refused", 1, tmp_path)
    assert _log(tmp_path / "log.jsonl") == [
        {"rollout": "r0", "status": 400, "param": "messages[0].role"}
    ]
    refusal = (
        "HTTP 400 (messages[0].role): messages[0].role must be one of "
        "['assistant', 'developer', 'system', 'tool', 'user'], got []"
    )
    assert result.failure is not None
    assert result.failure.reason == f"the gateway refused the agent's calls (1), last: {refusal}"
    details = (tmp_path / "failures" / "r0.txt").read_text()
    assert "(no details)" not in details
    assert details.endswith(f"refused calls (the gateway's answers):\n{refusal}\n")


def test_a_key_less_call_from_an_agent_is_refused_and_the_rollout_goes_on(
    loop_served: tuple[Gateway, GatewayServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNRL_TEST_LOG", str(tmp_path / "log.jsonl"))
    (result,) = _run_agents(loop_served, "without_key", 1, tmp_path)
    assert _log(tmp_path / "log.jsonl") == [
        {"rollout": "r0", "key": False, "status": 401},
        {"rollout": "r0", "key": True, "status": 401},
    ]
    assert result.failure is None and len(result.records) == 1


class BrokenLink(GatewayLink):
    """A gateway link whose ``finish`` raises for one rollout (a fault inside turnrl)
    and whose ``collect`` loses another's records."""

    def finish(self, rollout_id: str, reward: float) -> int:
        if rollout_id == "r1":
            raise RuntimeError("the link broke")
        return super().finish(rollout_id, reward)

    def collect(self) -> dict[str, Any]:
        found = super().collect()
        found.pop("r2", None)
        return found


def test_an_exception_in_one_rollout_is_that_rollout_s_failure(
    loop_served: tuple[Gateway, GatewayServer], tmp_path: Path
) -> None:
    gateway, server = loop_served
    results = _run_agents(loop_served, "without_key", 3, tmp_path, link=BrokenLink(gateway, server))
    assert results[0].failure is None and len(results[0].records) == 1
    broken, lost = results[1].failure, results[2].failure
    assert broken is not None and lost is not None
    assert broken.reason == "the rollout failed in turnrl: RuntimeError: the link broke"
    assert "Traceback" in (tmp_path / "failures" / "r1.txt").read_text()
    assert lost.reason == "the gateway lost the finished rollout's records"


def test_a_call_on_a_future_rollout_neither_crashes_nor_hangs_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through ``turnrl train``'s agent loop (AgentTrainer) with groups of two: a hostile
    agent calls a rollout of a later step and its sibling, with the run's key."""
    from test_agent_loop import agent_config
    from turnrl.train.agent.loop import AgentTrainer

    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("TURNRL_TEST_LOG", str(log))
    entrypoint = f"agent.entrypoint={HOSTILE}:calls_other_rollouts"
    config = agent_config(tmp_path, "train.steps=1", entrypoint, agent=None)
    run = AgentTrainer(config, quiet=True).run()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    assert metrics[1]["episodes"] == 4 and metrics[1]["agent_failures"] == 0
    attempts = [(e["rollout"][0], e["target"], e["status"]) for e in _log(log)]
    # evaluations at steps 0 and 1 (one rollout per task), step 1 (two per task)
    assert sorted(attempts) == sorted(
        [("e", "future", 404)] * 4
        + [("s", "future", 404), ("s", "sibling", 403), ("s", "sibling-reward", 403)] * 4
    )
    assert not (run / "agent_failures.jsonl").exists()


# ----------------------------------------------------------------------------- slow clients


def test_half_sent_headers_and_short_bodies_are_closed(
    served: tuple[Gateway, GatewayServer, Loader],
) -> None:
    gateway, server, _ = served  # request_timeout_s=1.0
    head, closed = hostile.half_headers("127.0.0.1", server.port, server.api_key, limit_s=20)
    assert closed
    status_line, _, rest = head.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 408 Request Timeout"
    assert json.loads(rest.partition(b"\r\n\r\n")[2])["error"]["message"] == (
        "the request did not arrive within 1 s; closing"
    )
    body, closed = hostile.short_body("127.0.0.1", server.port, server.api_key, limit_s=20)
    assert closed and body == b""
    assert gateway.views.rollouts() == []  # nothing was started by either
    status, _ = raw_http(server, "POST", f"/rollouts/after{CHAT}", chat_body())
    assert status == 200  # and the server still serves


def test_a_kept_alive_connection_gets_a_deadline_for_its_next_request(
    served: tuple[Gateway, GatewayServer, Loader],
) -> None:
    _, server, _ = served  # request_timeout_s=1.0; keep-alive 5 s
    with hostile._connect("127.0.0.1", server.port) as sock:
        sock.sendall(
            f"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {server.api_key}\r\n\r\n".encode()
        )
        first = b""
        while b"\r\n\r\n" not in first or not first.rstrip().endswith(b"}"):
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 OK")
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and no more
        rest, closed = hostile._read_until_closed(sock, limit_s=20)
    assert closed and rest.startswith(b"HTTP/1.1 408 Request Timeout")


def test_abandoned_rollouts_are_closed_when_idle(tiny: HFPolicy) -> None:
    config = GatewayConfig(idle_timeout_s=60.0)
    request = parse_chat_request(as_json(chat_body()))
    with Gateway(ScriptedPolicy(tiny, calculator_reply), config) as gateway:
        for i in range(3):
            gateway.complete(request, f"left-{i}")
        gateway.complete(request, "done")
        gateway.reward("done", 1.0)
        assert gateway.registry.close_expired(now=time.monotonic() + 30) == []
        closed = gateway.registry.close_expired(now=time.monotonic() + 61)
        assert sorted((c.rollout_id, c.turns, c.reason) for c in closed) == [
            ("left-0", 1, "idle"),
            ("left-1", 1, "idle"),
            ("left-2", 1, "idle"),
        ]
        assert gateway.stats["idle_closed"] == 3 and gateway.stats["open"] == 0
        assert [r.rollout_id for r in gateway.views.pop_finished_rollouts()] == ["done"]
        with pytest.raises(GatewayError) as late:
            gateway.complete(request, "left-0")
        assert (late.value.status, late.value.code) == (409, "rollout_closed")
        assert "is closed (idle)" in late.value.message


def test_the_idle_clock_restarts_with_every_call_and_spares_calls_in_flight() -> None:
    now = [0.0]
    table = RolloutTable(timeout_s=None, idle_s=10.0, clock=lambda: now[0])
    busy = table.get_or_create("busy", None, pinned=True)
    quiet = table.get_or_create("quiet", None, pinned=True)
    busy.in_flight = ("m", None)  # type: ignore[assignment]
    now[0] = 8.0
    quiet.last_active = now[0]  # a call ended at 8 s
    assert table.expired(17.9) == []  # busy: in flight; quiet: 10 s after its call at 8 s
    assert [(s.rollout_id, why) for s, why in table.expired(18.0)] == [("quiet", "idle")]
    busy.in_flight = None
    busy.last_active = 20.0
    assert [(s.rollout_id, why) for s, why in table.expired(30.0)] == [
        ("busy", "idle"),
        ("quiet", "idle"),
    ]


def test_an_early_finisher_survives_a_step_longer_than_the_timeout(tiny: HFPolicy) -> None:
    """Issue #22: finished rollouts wait (uncollected) until the step ends; a sweep past
    ``rollout_timeout_s`` closes only the ones still without a reward."""
    config = GatewayConfig(rollout_timeout_s=5.0, auto_open=False)
    request = parse_chat_request(as_json(chat_body()))
    with Gateway(ScriptedPolicy(tiny, calculator_reply), config) as gateway:
        for rid in ("early", "straggler", "late"):
            gateway.open_rollout(rid, "t")
        gateway.complete(request, "early")
        gateway.reward("early", 1.0)
        gateway.complete(request, "straggler")
        closed = gateway.registry.close_expired(now=time.monotonic() + 60)
        assert sorted((c.rollout_id, c.reason) for c in closed) == [
            ("late", "timeout"),
            ("straggler", "timeout"),
        ]
        (early,) = gateway.views.pop_finished_rollouts()
        assert (early.rollout_id, early.reward, len(early.records)) == ("early", 1.0, 1)
        assert gateway.stats["timed_out"] == 2 and gateway.stats["finished"] == 1


# ----------------------------------------------------------------------------- fields


@pytest.mark.parametrize(
    "messages, param, message",
    [
        (
            [{"role": [], "content": "hi"}],
            "messages[0].role",
            "messages[0].role must be one of ['assistant', 'developer', 'system', 'tool', "
            "'user'], got []",
        ),
        (
            [{"role": "user", "content": "hi"}, {"role": {"a": 1}, "content": "x"}],
            "messages[1].role",
            "messages[1].role must be one of ['assistant', 'developer', 'system', 'tool', "
            "'user'], got {'a': 1}",
        ),
        (
            [{"role": "user", "content": "a\ud800b"}],
            "messages[0].content",
            "messages[0].content: a lone surrogate (U+D800) at character 1 is not text; send "
            "valid UTF-8 (a surrogate pair only as two halves of one character)",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}],
            "messages[0].content[0].text",
            "messages[0].content[0].text: a lone surrogate (U+DFFF) at character 0 is not "
            "text; send valid UTF-8 (a surrogate pair only as two halves of one character)",
        ),
    ],
)
def test_malformed_roles_and_lone_surrogates_are_400s_naming_the_field(
    served: tuple[Gateway, GatewayServer, Loader],
    messages: list[Any],
    param: str,
    message: str,
) -> None:
    gateway, server, _ = served
    body = json.dumps({"model": "m", "messages": messages}).encode()  # \ud800 escaped
    status, payload = raw_http(server, "POST", f"/rollouts/f-1{CHAT}", body)
    assert status == 400
    assert payload["error"]["param"] == param
    assert payload["error"]["message"] == message
    assert gateway.views.rollouts() == []


def test_a_surrogate_pair_is_text(served: tuple[Gateway, GatewayServer, Loader]) -> None:
    _, server, _ = served
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "\U0001f600"}]})
    assert "\\ud83d\\ude00" in body
    status, _ = raw_http(server, "POST", f"/rollouts/pair-1{CHAT}", body.encode())
    assert status == 200
