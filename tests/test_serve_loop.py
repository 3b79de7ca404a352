"""The gateway's in-process API as a training loop uses it (docs/gateway.md, first section).

Rollouts opened with scoped endpoints, roles, a tool set kept for the whole
rollout, retried requests recorded once, timeouts and discards counted, weight
swaps between batches with versions on every record, greedy turns kept out of
training, Agent Lightning's reward event and proxy route, and a shutdown that
leaves no thread behind. Servers bind to 127.0.0.1 on a free port.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import torch

from serve_scripted import (
    CALCULATOR_TOOL,
    TOOLS_LINE,
    BlockingPolicy,
    GatedPolicy,
    ScriptedPolicy,
    as_json,
    assert_exact_prefixes,
    auth,
    calculator_reply,
    chat_body,
)
from turnrl import TurnTable
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.serve import (
    FinishedRollout,
    Gateway,
    GatewayConfig,
    GatewayError,
    GatewayServer,
    PortInUseError,
    bind_socket,
    parse_chat_request,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny() -> HFPolicy:
    return build_tiny_policy(seed=0)


@pytest.fixture
def served(tiny: HFPolicy) -> Iterator[tuple[Gateway, GatewayServer]]:
    with (
        Gateway(ScriptedPolicy(tiny, calculator_reply)) as gateway,
        GatewayServer(gateway) as server,
    ):
        yield gateway, server


def _ask(client: openai.OpenAI, messages: list[Any], **kwargs: Any) -> Any:
    return client.chat.completions.create(messages=messages, **{"model": "agent", **kwargs})


# ----------------------------------------------------------------------------- endpoints


def test_open_rollout_gives_a_scoped_endpoint_and_a_finished_rollout(
    served: tuple[Gateway, GatewayServer],
) -> None:
    gateway, server = served
    endpoint = server.open_rollout("run-1", "calc-2*3")
    secret = endpoint.secret
    assert secret is not None and len(secret) == 32 and endpoint.api_key == server.api_key
    assert endpoint.base_url == f"{server.url}/tasks/calc-2%2A3/rollouts/run-1/secret/{secret}/v1"
    assert endpoint.reward_url == f"{endpoint.base_url}/reward"
    assert endpoint.env() == {
        "OPENAI_BASE_URL": endpoint.base_url,
        "OPENAI_API_KEY": server.api_key,
        "AGL_OPENAI_BASE_URL": (
            f"{server.url}/proxy/rollout/run-1/attempt/{secret}/mode/train/openai/v1"
        ),
        "AGL_EVENT_URL": f"{server.url}/api/rollouts/run-1/attempt/{secret}/events",
        "AGL_KEY": server.api_key,
    }
    with pytest.raises(ValueError, match="already open"):
        server.open_rollout("run-1", "calc-2*3")
    client = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)
    messages: list[Any] = [{"role": "user", "content": "Compute 2*3."}]
    reply = _ask(client, messages, tools=[CALCULATOR_TOOL])
    call = reply.choices[0].message.tool_calls[0]
    messages += [
        reply.choices[0].message,
        {"role": "tool", "tool_call_id": call.id, "content": "6"},
    ]
    assert _ask(client, messages, tools=[CALCULATOR_TOOL]).choices[0].message.content == (
        "<answer>6</answer>"
    )
    summary = httpx.post(endpoint.reward_url, json={"reward": 1.0}, headers=auth(server)).json()
    assert summary["finished"] is True and summary["turns"] == 2
    (finished,) = gateway.views.pop_finished_rollouts()
    assert isinstance(finished, FinishedRollout)
    assert (finished.rollout_id, finished.task_id, finished.reward) == ("run-1", "calc-2*3", 1.0)
    assert (finished.policy_versions, finished.mixed_versions) == ((0,), False)
    assert [(r.turn, r.role, r.reward, r.done) for r in finished.records] == [
        (0, "agent", 0.0, False),
        (1, "agent", 1.0, True),
    ]
    assert gateway.views.pop_finished_rollouts() == []
    with pytest.raises(openai.ConflictError, match="closed"):
        _ask(client, [{"role": "user", "content": "again"}])


def test_a_rollout_that_never_calls_still_times_out(tiny: HFPolicy) -> None:
    config = GatewayConfig(rollout_timeout_s=30.0)
    with Gateway(ScriptedPolicy(tiny, calculator_reply), config) as gateway:
        gateway.open_rollout("silent", "t")
        gateway.complete(parse_chat_request(as_json(chat_body())), "talker", "t")
        assert gateway.registry.close_expired() == []  # both still in time
        closed = gateway.registry.close_expired(now=time.monotonic() + 31.0)
        assert sorted((c.rollout_id, c.turns, c.reason) for c in closed) == [
            ("silent", 0, "timeout"),
            ("talker", 1, "timeout"),
        ]
        assert gateway.views.rollouts() == [] and gateway.views.records() == []
        assert gateway.stats["timed_out"] == 2 and gateway.stats["open"] == 0
        assert [c.rollout_id for c in gateway.registry.pop_closed()] == ["silent", "talker"]
        assert gateway.registry.pop_closed() == []
        with pytest.raises(GatewayError) as caught:
            gateway.reward("talker", 1.0)
        assert (caught.value.status, caught.value.code) == (409, "rollout_closed")


def test_requests_close_timed_out_rollouts_themselves(tiny: HFPolicy) -> None:
    config = GatewayConfig(rollout_timeout_s=0.05)
    request = parse_chat_request(as_json(chat_body()))
    with Gateway(ScriptedPolicy(tiny, calculator_reply), config) as gateway:
        gateway.complete(request, "old")
        time.sleep(0.1)
        gateway.complete(request, "new")  # sweeps first: "old" is past its time
        assert [s["rollout_id"] for s in gateway.views.rollouts()] == ["new"]
        assert gateway.stats["timed_out"] == 1


def test_a_discarded_rollout_is_answered_but_not_recorded(tiny: HFPolicy) -> None:
    policy = BlockingPolicy(tiny)
    request = parse_chat_request(as_json(chat_body()))
    results: dict[str, Any] = {}
    with Gateway(policy) as gateway:
        gateway.open_rollout("doomed", "t")
        thread = threading.Thread(
            target=lambda: results.update(body=gateway.complete(request, "doomed"))
        )
        thread.start()
        assert policy.entered.wait(30)
        closed = gateway.discard("doomed", "agent raised ValueError")
        assert closed is not None and closed.reason == "discarded: agent raised ValueError"
        policy.release.set()
        thread.join(30)
        assert results["body"]["choices"][0]["message"]["content"] == "<answer>?</answer>"
        assert gateway.views.records() == [] and gateway.stats["discarded"] == 1
        assert gateway.discard("doomed", "again") is None


# ----------------------------------------------------------------------------- conversations


def test_a_later_call_without_tools_stays_prefix_exact(tiny: HFPolicy) -> None:
    """autogen's reflect_on_tool_use: the call after a tool result sends no tools."""
    always_calls = ScriptedPolicy(tiny, lambda context: "Again<call>1+1</call>")
    with Gateway(always_calls) as gateway, GatewayServer(gateway) as server:
        client = openai.OpenAI(base_url=server.base_url("reflect-1"), api_key=server.api_key)
        messages: list[Any] = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Compute 1+1."},
        ]
        first = _ask(client, messages, tools=[CALCULATOR_TOOL]).choices[0].message
        call_id = first.tool_calls[0].id
        messages += [first, {"role": "tool", "tool_call_id": call_id, "content": "2"}]
        reflection = _ask(client, messages).choices[0]  # no tools
        # The reply is not parsed for calls, and returned verbatim.
        assert reflection.finish_reason == "stop" and reflection.message.tool_calls is None
        assert reflection.message.content == "Again<call>1+1</call>"
        messages += [reflection.message, {"role": "user", "content": "Go on."}]
        none_choice = _ask(client, messages, tools=[CALCULATOR_TOOL], tool_choice="none")
        assert none_choice.choices[0].message.tool_calls is None
        records = gateway.views.rollout("reflect-1")["records"]
        assert [r["context_rebuilt"] for r in records] == [False, False, False]
        assert_exact_prefixes(records, always_calls.eos_token_id)
        # The policy saw the tool line on every turn, and its own call as it wrote it.
        assert all(r["prompt"][0]["content"] == f"Be brief.\n{TOOLS_LINE}" for r in records)
        assert records[1]["prompt"][2] == {"role": "assistant", "content": "Again<call>1+1</call>"}
        assert [r["tool_call"] for r in records] == [True, False, False]
        assert gateway.registry.context_rebuilds == 0


def test_roles_keep_their_own_conversations(served: tuple[Gateway, GatewayServer]) -> None:
    gateway, server = served
    client = openai.OpenAI(base_url=server.base_url("duo-1", "calc-3*4"), api_key=server.api_key)
    solver: list[Any] = [{"role": "user", "content": "Compute 3*4."}]
    checker: list[Any] = [{"role": "user", "content": "Check: Compute 3*4."}]
    for conversation, role in ((solver, "solver"), (checker, "checker")):
        reply = _ask(client, conversation, model=role, tools=[CALCULATOR_TOOL]).choices[0]
        conversation += [
            reply.message,
            {"role": "tool", "tool_call_id": reply.message.tool_calls[0].id, "content": "12"},
        ]
    for conversation, role in ((solver, "solver"), (checker, "checker")):
        _ask(client, conversation, model=role, tools=[CALCULATOR_TOOL])
    client.post("/reward", body={"reward": 1.0}, cast_to=object)
    records = gateway.views.rollout("duo-1")["records"]
    assert [(r["turn"], r["role"]) for r in records] == [
        (0, "solver"),
        (1, "checker"),
        (2, "solver"),
        (3, "checker"),
    ]
    for role in ("solver", "checker"):
        assert_exact_prefixes([r for r in records if r["role"] == role], 3)
    table = TurnTable.from_records(records)
    assert len(set(table.role_code.tolist())) == 2


def test_a_retried_request_is_answered_once_and_recorded_once(tiny: HFPolicy) -> None:
    """The official client times out and retries the same request while the first is
    still being sampled (held until the retry is sent): one sample, one record."""
    policy = GatedPolicy(tiny, calculator_reply)
    sent: list[str] = []

    def on_send(request: httpx.Request) -> None:
        sent.append(request.url.path)
        if len(sent) == 2:  # the retry is on its way: let the first call finish
            policy.gate.set()

    http = httpx.Client(event_hooks={"request": [on_send]})
    with Gateway(policy) as gateway, GatewayServer(gateway) as server:
        client = openai.OpenAI(
            base_url=server.base_url("retry-1"),
            api_key=server.api_key,
            timeout=1.0,
            max_retries=8,
            http_client=http,
        )
        reply = _ask(client, [{"role": "user", "content": "Compute 6*7."}])
        assert len(sent) >= 2  # the client did time out and retry
        assert reply.choices[0].message.tool_calls is None  # no tools offered
        assert reply.choices[0].message.content == "Let me<call>6*7</call>"
        assert policy.batches == [1]  # sampled once
        assert gateway.views.rollout("retry-1")["turns"] == 1
        # A retry after the answer arrived gets the same answer, also without sampling.
        again = _ask(client, [{"role": "user", "content": "Compute 6*7."}])
        assert again.id == reply.id and policy.batches == [1]


# ----------------------------------------------------------------------------- weights


def test_a_weight_swap_changes_the_logprobs_and_the_version(tiny: HFPolicy) -> None:
    policy = build_tiny_policy(seed=0)
    request = parse_chat_request(
        as_json(chat_body(logprobs=True, seed=3, temperature=1.0, max_tokens=6))
    )
    with Gateway(policy, GatewayConfig(default_max_tokens=6)) as gateway:
        before = gateway.complete(request, "v0")
        gateway.load_weights(build_tiny_policy(seed=1).state_dict(), version=1)
        after = gateway.complete(request, "v1")
        logprobs = [
            [t["logprob"] for t in body["choices"][0]["logprobs"]["content"]]
            for body in (before, after)
        ]
        assert logprobs[0] != logprobs[1]
        assert [b["turnrl"]["policy_version"] for b in (before, after)] == [0, 1]
        # A rollout that spans the swap is flagged.
        follow_up = parse_chat_request(
            {
                **as_json(chat_body(seed=3, max_tokens=6)),
                "messages": [
                    {"role": "user", "content": "hi"},
                    before["choices"][0]["message"],
                    {"role": "user", "content": "more"},
                ],
            }
        )
        gateway.complete(follow_up, "v0")
        for rollout_id in ("v0", "v1"):
            gateway.reward(rollout_id, 0.0)
        spans = {r.rollout_id: r for r in gateway.views.pop_finished_rollouts()}
        assert spans["v0"].policy_versions == (0, 1) and spans["v0"].mixed_versions
        assert spans["v1"].policy_versions == (1,) and not spans["v1"].mixed_versions
        assert gateway.stats["policy_version"] == 1


def test_a_swap_waits_for_the_batch_being_sampled(tiny: HFPolicy) -> None:
    policy = BlockingPolicy(tiny)
    request = parse_chat_request(as_json(chat_body()))
    results: dict[str, Any] = {}
    with Gateway(policy) as gateway:
        sampling = threading.Thread(
            target=lambda: results.update(body=gateway.complete(request, "swap-1"))
        )
        sampling.start()
        assert policy.entered.wait(30)

        def update() -> None:
            with gateway.updating(version=7) as served_policy:
                results["updated"] = served_policy is policy

        updating = threading.Thread(target=update)
        updating.start()
        updating.join(0.3)
        assert updating.is_alive()  # held until the sample is done
        policy.release.set()
        sampling.join(30)
        updating.join(30)
        assert results["updated"] is True
        assert results["body"]["turnrl"]["policy_version"] == 0
        assert gateway.policy_version == 7
        other = ScriptedPolicy(tiny, calculator_reply)
        other.eos_token_id = 0
        with pytest.raises(ValueError, match="tokenises differently"):
            gateway.swap_policy(other, version=8)
        gateway.swap_policy(ScriptedPolicy(tiny, lambda context: "new"), version=8)
        assert gateway.complete(request, "swap-2")["choices"][0]["message"]["content"] == "new"


def test_greedy_turns_are_recorded_out_of_training(tiny: HFPolicy) -> None:
    request = parse_chat_request(as_json(chat_body(temperature=0, logprobs=True, max_tokens=5)))
    with Gateway(tiny) as gateway:
        body = gateway.complete(request, "greedy-1")
        (record,) = gateway.views.records()
    assert record.temperature == 0.0 and record.train is False
    assert record.logprobs == (0.0,) * len(record.response_ids)
    # The HTTP answer reports the model's own (untempered) log-probs, as OpenAI does.
    http_logprobs = [t["logprob"] for t in body["choices"][0]["logprobs"]["content"]]
    assert all(lp < 0 for lp in http_logprobs)


# ----------------------------------------------------------------------------- Agent Lightning


def test_agent_lightning_routes_finish_a_rollout(served: tuple[Gateway, GatewayServer]) -> None:
    """An agent written for Agent Lightning (AGL_OPENAI_BASE_URL, AGL_EVENT_URL,
    AGL_KEY, its reward event) runs unchanged against the gateway."""
    gateway, server = served
    env = server.open_rollout("agl-1", "calc-5*5").env()
    client = openai.OpenAI(base_url=env["AGL_OPENAI_BASE_URL"], api_key=env["AGL_KEY"])
    reply = _ask(client, [{"role": "user", "content": "Compute 5*5."}], model="auto")
    assert reply.model_extra["turnrl"]["rollout_id"] == "agl-1"
    headers = {"Authorization": f"Bearer {env['AGL_KEY']}"}
    note = httpx.post(
        env["AGL_EVENT_URL"], json={"event_type": "note", "data": {"x": 1}}, headers=headers
    )
    assert note.status_code == 200 and note.json()["recorded"] is False
    event = {"event_type": "reward", "data": {"value": 1.0}}
    answer = httpx.post(env["AGL_EVENT_URL"], json=event, headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.json()["rollout"]["finished"] is True
    (finished,) = gateway.views.pop_finished_rollouts()
    assert (finished.task_id, finished.reward, finished.records[0].role) == (
        "calc-5*5",
        1.0,
        "auto",
    )
    bad = httpx.post(
        env["AGL_EVENT_URL"], json={"event_type": "reward", "data": {}}, headers=headers
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "data.value"


def test_the_reward_event_is_accepted_on_the_reward_routes(
    served: tuple[Gateway, GatewayServer],
) -> None:
    gateway, server = served
    client = openai.OpenAI(base_url=server.base_url("agl-2"), api_key=server.api_key)
    _ask(client, [{"role": "user", "content": "hi"}])
    event = {"event_type": "reward", "data": {"value": 0.5}}
    assert client.post("/reward", body=event, cast_to=object)["reward"] == 0.5
    assert gateway.views.rollout("agl-2")["records"][-1]["reward"] == 0.5


# ----------------------------------------------------------------------------- lifecycle


def test_rewards_are_idempotent(served: tuple[Gateway, GatewayServer]) -> None:
    gateway, _ = served
    gateway.complete(parse_chat_request(as_json(chat_body())), "idem-1")
    assert gateway.reward("idem-1", 1)["reward"] == 1.0
    assert gateway.reward("idem-1", 1.0)["reward"] == 1.0  # a retried post
    with pytest.raises(GatewayError, match="already has reward"):
        gateway.reward("idem-1", 0.0)
    gateway.views.pop_finished_rollouts()
    assert gateway.reward("idem-1", 1.0)["finished"] is True
    with pytest.raises(GatewayError) as caught:
        gateway.reward("idem-1", 0.0)
    assert caught.value.code == "rollout_closed"


def test_a_busy_port_fails_at_once(tiny: HFPolicy) -> None:
    holder = bind_socket("127.0.0.1", 0)
    try:
        port = holder.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"127.0.0.1:{port} is already in use"):
            bind_socket("127.0.0.1", port)
        with Gateway(tiny) as gateway, pytest.raises(PortInUseError):
            GatewayServer(gateway, port=port)
    finally:
        holder.close()


def test_shutdown_leaves_no_thread_and_frees_the_port(tiny: HFPolicy) -> None:
    before = set(threading.enumerate())
    with (
        Gateway(ScriptedPolicy(tiny, calculator_reply)) as gateway,
        GatewayServer(gateway) as server,
    ):
        client = openai.OpenAI(base_url=server.base_url("bye-1"), api_key=server.api_key)
        _ask(client, [{"role": "user", "content": "hi"}])
        client.close()
        port = server.port
    deadline = time.monotonic() + 5
    while set(threading.enumerate()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(threading.enumerate()) - before == set()
    with socket.create_server(("127.0.0.1", port)):  # the port is free again
        pass
