"""The ``vllm-server`` backend's client on hand-built answers (no server, no vllm needed).

What a server answers is untrusted input: parsed and checked, a malformed answer is a
``SamplerServerError`` naming the field. The real server is exercised in
``tests/test_vllm_backend.py`` (``.venv-vllm``).
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from fake_vllm import NOT_FOUND, JsonServer
from turnrl.errors import SamplerServerError, TurnrlError
from turnrl.policy.sync import push_weights
from turnrl.policy.vllm import engine_sample, response_budget
from turnrl.policy.vllm_server import VLLMServerPolicy, parse_completion
from turnrl.serve import cli as serve_cli
from turnrl.train.config import RunConfig, load_config
from turnrl.train.validate import ConfigError, validate

WHERE = "POST http://h:1/v1/completions"


def answer(ids: object, logprobs: object) -> dict:
    return {"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": logprobs}}]}


def test_a_well_formed_answer_gives_ids_and_logprobs() -> None:
    assert parse_completion(answer([5, 7, 2], [-0.5, -1, -0.25]), WHERE) == (
        [5, 7, 2],
        [-0.5, -1.0, -0.25],
    )
    assert parse_completion(answer([], []), WHERE) == ([], [])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "choices"),
        ([], "choices"),
        ({"choices": []}, "choices"),
        ({"choices": [{}, {}]}, "choices"),
        (answer(None, []), "choices[0].token_ids"),
        (answer([1, -2], [0.0, 0.0]), "choices[0].token_ids"),
        (answer([1, True], [0.0, 0.0]), "choices[0].token_ids"),
        (answer(["token_id:1"], [0.0]), "choices[0].token_ids"),
        (answer([1, 2], [0.0]), "choices[0].logprobs.token_logprobs"),
        (answer([1], ["-0.1"]), "choices[0].logprobs.token_logprobs"),
        (answer([1], [None]), "choices[0].logprobs.token_logprobs"),
        ({"choices": [{"token_ids": [1], "logprobs": None}]}, "choices[0].logprobs.token_logprobs"),
    ],
)
def test_a_malformed_answer_names_the_field(body: object, field: str) -> None:
    with pytest.raises(SamplerServerError) as caught:
        parse_completion(body, WHERE)
    assert str(caught.value).startswith(f"{WHERE}: field {field!r}: ")
    assert isinstance(caught.value, TurnrlError)  # the CLI prints one line, exit 2


def test_samples_keep_the_stop_token_and_say_why_they_ended() -> None:
    stop = [2, 3]
    stopped = engine_sample([5, 6, 2], [-1.0, -2.0, -0.5], stop, lambda ids: f"{ids}")
    assert (stopped.stop_reason, stopped.response_ids, stopped.text) == (
        "stop",
        [5, 6, 2],
        "[5, 6, 2]",
    )
    cut = engine_sample([5, 6], [-1.0, -2.0], stop, str)
    assert cut.stop_reason == "length" and cut.logprobs == [-1.0, -2.0]
    assert engine_sample([], [], stop, str).stop_reason == "length"
    assert response_budget([1] * 10, 8, None) == 8
    assert response_budget([1] * 10, 8, 14) == 4


def test_an_unreachable_server_is_a_clear_error() -> None:
    from turnrl.policy.factory import build_tiny_policy

    with pytest.raises(SamplerServerError, match=r"GET http://127.0.0.1:9/v1/models: no answer"):
        VLLMServerPolicy.from_policy(build_tiny_policy(0), "http://127.0.0.1:9/v1", timeout_s=5)


def test_push_weights_hands_a_server_client_the_learner() -> None:
    class Client:
        def __init__(self) -> None:
            self.got: list[tuple[object, int]] = []

        def load_learner(self, learner: object, version: int) -> None:
            self.got.append((learner, version))

        def load_full_weights(self, weights: object, version: int) -> None:  # pragma: no cover
            pytest.fail("a server client takes the learner, not full weights in memory")

    learner, client = object(), Client()
    push_weights(learner, client, 3)
    assert client.got == [(learner, 3)]


def test_the_vllm_server_backend_needs_a_url() -> None:
    config = load_config(RunConfig, None, ["policy.backend=vllm-server"])
    with pytest.raises(ConfigError) as caught:
        validate(config)
    assert "policy.server_url" in str(caught.value)
    validate(
        load_config(RunConfig, None, ["policy.backend=vllm-server", "policy.server_url=http://h:1"])
    )


def test_serve_refuses_vllm_server_without_a_url() -> None:
    args = argparse.Namespace(backend="vllm-server", server_url="")
    with pytest.raises(serve_cli.ServeOptionError, match="--server-url"):
        serve_cli.build_served(object(), args)


class FakeVLLMServer(JsonServer):
    """A vLLM server's routes the LoRA push uses (no dev routes), recording every call;
    the adapters it holds are those loaded and not unloaded since."""

    def __init__(self) -> None:
        self.adapters: set[str] = set()
        super().__init__()

    def get(self, path: str) -> tuple[int, object]:
        if path == "/v1/models":
            return 200, {"data": [{"id": "base", "max_model_len": 4096}]}
        return NOT_FOUND

    def post(self, path: str, body: Any) -> tuple[int, object]:
        if path == "/v1/load_lora_adapter":
            self.adapters.add(body["lora_name"])
        elif path == "/v1/unload_lora_adapter":
            self.adapters.discard(body["lora_name"])
        else:
            return NOT_FOUND
        return 200, "ok"


def test_each_lora_push_unloads_the_previous_versions_adapter() -> None:
    """Three pushes of a LoRA learner to a server without dev routes: each loads the
    version's adapter, requests then name it, and the previous version's adapter is
    unloaded, so the server holds one adapter, not one per step (#38's planted bug:
    old adapters never unloaded)."""
    from turnrl.policy import factory
    from turnrl.train.config import PolicyConfig

    learner = factory.build_policy(PolicyConfig(lora_rank=2, lora_alpha=4.0), 0)
    server = FakeVLLMServer()
    client = VLLMServerPolicy.from_policy(learner, server.url, timeout_s=10)
    try:
        for version in (1, 2, 3):
            push_weights(learner, client, version)
            assert server.adapters == {f"turnrl-v{version}"}
            assert client.served_model == f"turnrl-v{version}"
    finally:
        client.close()
        server.close()
    routes = [(path, body["lora_name"]) for method, path, body in server.calls if "lora" in path]
    assert routes == [
        ("/v1/load_lora_adapter", "turnrl-v1"),
        ("/v1/load_lora_adapter", "turnrl-v2"),
        ("/v1/unload_lora_adapter", "turnrl-v1"),
        ("/v1/load_lora_adapter", "turnrl-v3"),
        ("/v1/unload_lora_adapter", "turnrl-v2"),
    ]
    assert not client.weights_dir.exists()  # the client's own directory is removed


@pytest.mark.parametrize(
    ("temperature", "sent", "recorded"),
    [(1e-40, 0.0, [0.0, 0.0]), (1e-300, 0.0, [0.0, 0.0]), (0.5, 0.5, [-0.5, -1.25])],
)
def test_a_tiny_temperature_is_asked_as_greedy_and_recorded_with_log_prob_0(
    temperature: float, sent: float, recorded: list[float]
) -> None:
    """The server would raise a temperature in (0, 0.01) to 0.01 and sample there: the
    client asks for 0 (greedy) and records the limit's log-prob 0 (#38)."""
    from turnrl.policy.tiny import build_tiny_tokenizer

    server = FakeVLLMServer()
    client = VLLMServerPolicy(server.url, build_tiny_tokenizer(), timeout_s=10)
    bodies: list[dict] = []

    def complete(method: str, path: str, body: dict) -> dict:
        bodies.append(body)
        return answer([7, 9], [-0.5, -1.25])

    client._call = complete  # type: ignore[method-assign]
    try:
        [sample] = client.sample([[5, 6]], max_new_tokens=2, temperature=temperature, seed=1)
    finally:
        client.close()
        server.close()
    assert [b["temperature"] for b in bodies] == [sent]
    assert sample.response_ids == [7, 9] and sample.logprobs == recorded
