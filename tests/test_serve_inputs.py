"""The gateway under bad input and faults (issue 15): nothing lost, clear errors early.

A records file whose append fails keeps the trajectory and writes it later; a
user's file without a final newline keeps its last line; huge integers anywhere
in a body are a 400 naming the field; oversized requests are refused before any
tokenising; ``turnrl serve`` refuses a bad port, a busy port, a bad records path
and a directory that is not a model with exit 2 before loading anything; and a
running server reloads a policy directory on request.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from serve_scripted import ScriptedPolicy, as_json, auth, calculator_reply, chat_body, raw_http
from turnrl.cli import main
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.serve import (
    Gateway,
    GatewayConfig,
    GatewayError,
    GatewayServer,
    RecordsPathError,
    bind_socket,
    parse_chat_request,
    recordsfile,
)
from turnrl.serve import cli as serve_cli
from turnrl.serve.recordsfile import RecordsFile, check_records_path

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny() -> HFPolicy:
    return build_tiny_policy(seed=0)


def _finish(gateway: Gateway, rollout_id: str, reward: float) -> dict[str, Any]:
    gateway.complete(parse_chat_request(as_json(chat_body())), rollout_id, f"task-{rollout_id}")
    return gateway.reward(rollout_id, reward)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ----------------------------------------------------------------------------- records file


def test_a_failed_append_keeps_the_trajectory_and_a_later_one_writes_it(
    tiny: HFPolicy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text('{"user": "line"}\n')
    disk_full = {"on": True}
    real_fsync = os.fsync

    def fsync(fd: int) -> None:  # the write went through; making it durable fails
        if disk_full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(recordsfile.os, "fsync", fsync)
    with Gateway(
        ScriptedPolicy(tiny, calculator_reply), GatewayConfig(records_path=str(path))
    ) as g:
        first = _finish(g, "lost-1", 1.0)
        assert first["finished"] is True and first["records_written"] is False
        # The bytes of the failed append are cut off again; the user's line stays.
        assert path.read_text() == '{"user": "line"}\n'
        assert g.stats["unwritten_rollouts"] == 1
        assert "No space left" in g.stats["records_error"]
        disk_full["on"] = False
        second = _finish(g, "later-2", 0.0)
        assert second["records_written"] is True
        assert g.stats["unwritten_rollouts"] == 0 and g.stats["records_error"] is None
    rows = _lines(path)
    assert rows[0] == {"user": "line"}
    assert [(r["traj_id"], r["reward"], r["done"]) for r in rows[1:]] == [
        ("lost-1", 1.0, True),
        ("later-2", 0.0, True),
    ]


def test_flush_retries_and_close_saves_what_is_left(
    tiny: HFPolicy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "records.jsonl"
    failing = {"on": True}
    real_append = recordsfile._append

    def append(target: Path, data: bytes) -> None:
        if failing["on"]:
            raise OSError(errno.EIO, "Input/output error")
        real_append(target, data)

    monkeypatch.setattr(recordsfile, "_append", append)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gateway = Gateway(ScriptedPolicy(tiny, calculator_reply), GatewayConfig(records_path=str(path)))
    try:
        _finish(gateway, "a", 1.0)
        _finish(gateway, "b", 0.0)
        assert gateway.flush_records() == 2
        failing["on"] = False
        assert gateway.flush_records() == 0
        assert [r["traj_id"] for r in _lines(path)] == ["a", "b"]
        failing["on"] = True
        _finish(gateway, "c", 1.0)
    finally:
        gateway.close()  # still failing: "c" goes to a file in the temporary directory
    (saved,) = tmp_path.glob("turnrl-unwritten-*.jsonl")
    assert [r["traj_id"] for r in _lines(saved)] == ["c"]


def test_a_file_without_final_newline_keeps_its_last_line(tiny: HFPolicy, tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text('{"a": 1}\n{"b": 2}')  # no final newline
    with Gateway(
        ScriptedPolicy(tiny, calculator_reply), GatewayConfig(records_path=str(path))
    ) as g:
        assert _finish(g, "nl-1", 1.0)["records_written"] is True
    rows = _lines(path)
    assert rows[:2] == [{"a": 1}, {"b": 2}] and rows[2]["traj_id"] == "nl-1"
    assert path.read_text().startswith('{"a": 1}\n{"b": 2}\n{')


def test_records_paths_are_checked_up_front(tmp_path: Path) -> None:
    assert check_records_path(tmp_path / "new" / "deeper" / "r.jsonl").name == "r.jsonl"
    with pytest.raises(RecordsPathError, match="is a directory"):
        check_records_path(tmp_path)
    with pytest.raises(RecordsPathError, match="not a regular file"):
        check_records_path("/dev/null")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RecordsPathError, match="is not a directory"):
        check_records_path(blocker / "r.jsonl")
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "missing" / "target.jsonl")
    with pytest.raises(RecordsPathError, match="symbolic link to a missing file"):
        check_records_path(dangling)
    with pytest.raises(RecordsPathError):
        RecordsFile(tmp_path)


# ----------------------------------------------------------------------------- bodies


@pytest.fixture(scope="module")
def served(tiny: HFPolicy) -> Any:
    with (
        Gateway(ScriptedPolicy(tiny, calculator_reply)) as gateway,
        GatewayServer(gateway) as server,
    ):
        yield gateway, server


HUGE = "9" * 400


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/rollouts/x/reward", '{"reward": ' + HUGE + "}", "reward"),
        ("/v1/rollouts/x/reward", '{"reward": 1e999}', "reward"),
        (
            "/api/rollouts/x/attempt/a/events",
            '{"event_type": "reward", "data": {"value": ' + HUGE + "}}",
            "data.value",
        ),
        (
            "/rollouts/x/v1/chat/completions",
            '{"reward": 1, "deep": [[{"n": -' + HUGE + "}]]}",
            "deep[0][0].n",
        ),
        (
            "/rollouts/x/v1/chat/completions",
            '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": '
            + HUGE
            + "}",
            "temperature",
        ),
        (
            "/rollouts/x/v1/chat/completions",
            '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}',
            "temperature",
        ),
        (
            "/rollouts/x/v1/chat/completions",
            '{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
            '"seed": 99999999999999999999}',
            "seed",
        ),
    ],
)
def test_huge_numbers_anywhere_are_a_400_naming_the_field(
    served: Any, path: str, body: str, param: str
) -> None:
    _, server = served
    status, payload = raw_http(server, "POST", path, body.encode())
    assert (status, payload["error"]["param"]) == (400, param)


def test_huge_integers_in_tool_call_arguments_stay_text(served: Any) -> None:
    gateway, server = served
    arguments = '{"expression": ' + HUGE + "}"
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
    ]
    body = json.dumps({"model": "m", "messages": messages}).encode()
    status, _ = raw_http(server, "POST", "/rollouts/args-1/v1/chat/completions", body)
    assert status == 200
    assert HUGE in gateway.views.rollout("args-1")["records"][0]["prompt"][1]["content"]
    with pytest.raises(GatewayError, match="finite number"):
        gateway.reward("args-1", 10**400)


class CountingPolicy(ScriptedPolicy):
    """Counts tokeniser calls, to show refused requests were never tokenised."""

    encoded = 0

    def encode_initial(self, messages: list[dict[str, str]]) -> list[int]:
        self.encoded += 1
        return super().encode_initial(messages)


def test_oversized_requests_are_refused_before_tokenising(tiny: HFPolicy) -> None:
    policy = CountingPolicy(tiny, calculator_reply, max_context=24)
    with Gateway(policy) as gateway:
        for messages in (
            [{"role": "user", "content": "x" * (16 * 24 + 1)}],  # over 16 characters a position
            [{"role": "user", "content": "x"}] * 24,  # a position at least per message
        ):
            with pytest.raises(GatewayError) as caught:
                gateway.complete(parse_chat_request({"model": "m", "messages": messages}), "big")
            assert (caught.value.status, caught.value.code) == (400, "context_length_exceeded")
        assert policy.encoded == 0
        small = GatewayConfig(max_request_chars=10)
    with Gateway(policy, small) as gateway, pytest.raises(GatewayError, match="at most 10"):
        gateway.complete(
            parse_chat_request(
                as_json(chat_body(messages=[{"role": "user", "content": "x" * 11}]))
            ),
            "big",
        )


# ----------------------------------------------------------------------------- turnrl serve


def _never_load(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the policy must not be loaded after a start-up error")


def test_serve_refuses_a_port_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["serve", "--port", "70000"])
    assert caught.value.code == 2
    assert "--port: 70000 is not a port (0 to 65535" in capsys.readouterr().err


def test_serve_refuses_a_busy_port_before_loading(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serve_cli, "load_policy", _never_load)
    with bind_socket("127.0.0.1", 0) as holder:
        port = holder.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    assert f"--host/--port: 127.0.0.1:{port} is already in use" in capsys.readouterr().err


def test_serve_refuses_a_bad_records_path_before_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serve_cli, "load_policy", _never_load)
    assert main(["serve", "--port", "0", "--records", str(tmp_path)]) == 2
    assert f"--records: {tmp_path}: is a directory" in capsys.readouterr().err


def test_serve_refuses_a_directory_that_is_not_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--port", "0", "--policy", str(tmp_path)]) == 2
    assert "--policy" in (err := capsys.readouterr().err) and "not a model directory" in err
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    assert main(["serve", "--port", "0", "--policy", str(tmp_path)]) == 2
    assert "--policy" in (err := capsys.readouterr().err) and "cannot load" in err
    assert "Traceback" not in err


def test_a_running_server_reloads_a_policy_directory(tiny: HFPolicy, tmp_path: Path) -> None:
    build_tiny_policy(seed=1).save(tmp_path / "v1")
    request = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "logprobs": True,
        "seed": 5,
        "max_tokens": 5,
    }
    with (
        Gateway(build_tiny_policy(seed=0)) as gateway,
        GatewayServer(gateway, reload=serve_cli.load_policy) as server,
    ):
        client = openai.OpenAI(base_url=server.base_url("before"), api_key=server.api_key)
        before = client.chat.completions.create(**request)
        answer = httpx.post(
            f"{server.url}/admin/reload",
            json={"policy": str(tmp_path / "v1")},
            headers=auth(server),
        )
        assert answer.json() == {"policy": str(tmp_path / "v1"), "policy_version": 1}
        client = openai.OpenAI(base_url=server.base_url("after"), api_key=server.api_key)
        after = client.chat.completions.create(**request)
        assert [t.logprob for t in before.choices[0].logprobs.content] != [
            t.logprob for t in after.choices[0].logprobs.content
        ]
        assert after.model_extra["turnrl"]["policy_version"] == 1
        bad = httpx.post(
            f"{server.url}/admin/reload", json={"policy": str(tmp_path)}, headers=auth(server)
        )
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "policy"
        assert gateway.policy_version == 1


def test_reload_is_absent_unless_the_server_has_a_loader(tiny: HFPolicy) -> None:
    with Gateway(tiny) as gateway, GatewayServer(gateway) as server:
        reload = httpx.post(
            f"{server.url}/admin/reload", json={"policy": "x"}, headers=auth(server)
        )
        assert reload.status_code == 404


def test_the_socket_is_not_reusable_while_served(tiny: HFPolicy) -> None:
    with Gateway(tiny) as gateway, GatewayServer(gateway) as server, pytest.raises(OSError):
        socket.create_server(("127.0.0.1", server.port))
