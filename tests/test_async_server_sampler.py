"""``train.max_staleness = 1`` on a vLLM server (``policy.backend = "vllm-server"``): the
environment trainer's sampler process is the server's one client (docs/async.md).

The server here is :class:`fake_vllm.TransformersVLLMServer`, which samples with a
transformers copy behind vLLM's routes (real HTTP, in this process; the real server is
``tests/test_vllm_server.py``, slow). It starts from other weights than the learner's
(seed 7), so every sample it gives is right only if the learner's weights reached it
first; it records the version it held for each completion.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from fake_vllm import TransformersVLLMServer
from turnrl.train.async_sampler import SamplerProcess
from turnrl.train.lifecycle import Lifecycle
from turnrl.train.online.asynchronous import AsyncOnlineTrainer, online_trainer
from turnrl.train.validate import ConfigError, validate

SHORT_EPISODES = ("train.log_rollouts_every=1", "env.env_kwargs={max_turns = 2, turn_cost = 0.0}")


def turn_versions(run: Path, steps: int) -> Counter[int]:
    """How many sampled turns each weight version gave, over the run's rollout logs."""
    versions: Counter[int] = Counter()
    for step in range(1, steps + 1):
        for line in (run / "rollouts" / f"step-{step:06d}.jsonl").read_text().splitlines():
            versions[json.loads(line)["policy_version"]] += 1
    return versions


@pytest.mark.parametrize("lora", [False, True], ids=["full-weights", "lora"])
def test_k1_on_a_server_pushes_each_version_between_the_steps_that_sample_with_it(
    tiny_train, read_metrics, tmp_path: Path, lora: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 steps at K = 1 (checkpoints at 2 and 4) against the server: it gets versions 0
    to 4 in order and nothing else; each completion came from the version the turn's
    record names (the schedule's 0, 0, 2, 2), so no push fell between a step's
    requests; evaluation never reached the server (the learner evaluates itself); step
    1's log-probs are the learner's (with the start-up push skipped the seed-7 server's
    are not); and the server ends on the learner's final weights. For LoRA, the first
    push also gives the server the learner's base, then adapters only."""
    from turnrl.policy import lora as lora_module
    from turnrl.policy.factory import build_policy
    from turnrl.policy.sync import full_weights

    start = tiny_train(tmp_path / "x")
    server = TransformersVLLMServer(build_policy(start.policy, 7))
    extra = ("policy.lora_rank=4", "policy.lora_alpha=8.0") if lora else ()
    config = tiny_train(
        tmp_path / "run", *SHORT_EPISODES, *extra, "train.max_staleness=1", "train.tis_cap=2.0",
        "train.log_mismatch=true", "policy.backend=vllm-server", f"policy.server_url={server.url}",
    )  # fmt: skip
    validate(config)
    trainer = online_trainer(config, quiet=True)
    assert isinstance(trainer, AsyncOnlineTrainer)
    pushed: list[set[str]] = []  # the names each push put in shared memory
    push = SamplerProcess.push

    def recording(self: SamplerProcess, version: int, state: dict) -> None:
        pushed.append(set(state))
        push(self, version, state)

    monkeypatch.setattr(SamplerProcess, "push", recording)
    try:
        Lifecycle(trainer).run()
    finally:
        server.close()
    whole = set(trainer.policy.model.state_dict())
    adapters = {n for n, p in trainer.policy.model.named_parameters() if p.requires_grad}
    assert len(pushed) == 5
    if lora:  # everything once, then the adapters alone (the base is frozen)
        assert all("lora_" in name for name in adapters) and adapters < whole
        assert pushed == [whole] + [adapters] * 4
    else:
        assert pushed == [whole] * 5
    assert trainer.rollout_policy is trainer.policy  # it evaluated with itself
    assert trainer._weights_dir is not None and not Path(trainer._weights_dir).exists()
    if lora:  # the base once, then each version's adapters
        assert server.loads == [("full", 0)] + [("lora", v) for v in range(5)]
    else:
        assert server.loads == [("full", v) for v in range(5)]
    rows = read_metrics(tmp_path / "run")
    assert [r["policy_version"] for r in rows[1:]] == [0, 0, 2, 2]
    assert Counter(server.held) == turn_versions(tmp_path / "run", 4)
    assert rows[1]["mismatch_logp_abs_max"] < 1e-4
    learner = full_weights(trainer.policy)
    served, _ = server.models[server.served_name()]
    assert lora_module.is_adapter_model(trainer.policy.model) is lora
    for name, tensor in served.state_dict().items():
        torch.testing.assert_close(tensor, learner[name], atol=1e-6, rtol=0)


def test_a_server_is_refused_under_torchrun_ranks(
    tiny_train, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rank's sampler process would push its own copy to the one server between
    the other ranks' requests: refused, naming the field; one process is allowed."""
    server = ("policy.backend=vllm-server", "policy.server_url=http://127.0.0.1:9")
    config = tiny_train(tmp_path / "run", "train.max_staleness=1", *server)
    validate(config)
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=r"train\.max_staleness: each of torchrun's 2 ranks"):
        validate(config)


def test_a_push_to_the_server_copy_may_leave_out_only_its_frozen_weights() -> None:
    """After the first push (which must be whole), a push may leave out the copy's
    frozen weights (a LoRA base) but no trained one, and may hold no unknown name."""
    from turnrl.train.async_sampler import _check_partial_push

    model = torch.nn.Linear(2, 2)
    model.bias.requires_grad_(False)  # frozen, as a LoRA copy's base
    weight, bias = model.weight.detach(), model.bias.detach()
    _check_partial_push(model, {"weight": weight, "bias": bias}, first=True)
    _check_partial_push(model, {"weight": weight}, first=False)
    for state, first in (
        ({"weight": weight}, True),  # the first push leaves the base out
        ({"bias": bias}, False),  # a trained weight left out
        ({"weight": weight, "bias": bias, "extra": bias}, False),  # a name it lacks
    ):
        with pytest.raises(KeyError, match="a push the server's copy cannot take"):
            _check_partial_push(model, state, first=first)
