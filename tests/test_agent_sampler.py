"""The agent loop samples through the policy boundary (``build_sampler``/``push_weights``).

With ``policy.backend = "vllm"`` the gateway serves a vLLM engine, not the
learner; here a separate in-process copy of the learner stands in for it (the
main venv has no vllm; ``tests/test_vllm_backend.py`` runs the real engine in
``.venv-vllm``). What must hold for any such sampler: the gateways serve it, not
the learner, and every update reaches it before the next step samples.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import turnrl.train.agent.loop as agent_loop
from turnrl.policy import HFPolicy
from turnrl.train.agent.loop import AgentTrainer
from turnrl.train.config import RunConfig, load_config
from turnrl.train.validate import ConfigError, validate

torch.set_num_threads(1)

FIXTURES = Path(__file__).with_name("agent_fixtures.py")


def _tasks(path: Path, n: int, prefix: str) -> str:
    rows = [json.dumps({"task_id": f"{prefix}-{i}", "question": f"Q{i}?"}) for i in range(n)]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def _config(tmp_path: Path, *overrides: str) -> RunConfig:
    return load_config(
        RunConfig,
        None,
        [
            f"run_dir={tmp_path / 'run'}",
            f"tasks.train={_tasks(tmp_path / 'train.jsonl', 4, 't')}",
            f"tasks.eval={_tasks(tmp_path / 'eval.jsonl', 2, 'e')}",
            f"agent.entrypoint={FIXTURES}:two_calls_graded",
            "warm_start.steps=0",
            "rollout.tasks_per_step=2",
            "rollout.group_size=2",
            "policy.max_new_tokens=8",
            "train.steps=2",
            "train.eval_every=2",
            "train.checkpoint_every=1",
            "train.minibatch_size=4",
            "train.threads=1",
            "agent.concurrency=4",
            "agent.timeout_s=60",
            *overrides,
        ],
    )


def _weights(policy: HFPolicy) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in policy.state_dict().items()}


def test_the_gateway_serves_the_sampler_and_every_update_reaches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    samplers: list[HFPolicy] = []
    closed: list[HFPolicy] = []

    def separate_copy(settings: Any, learner: HFPolicy, **options: Any) -> HFPolicy:
        sampler = copy.deepcopy(learner)  # a sampler starts from the learner's weights
        sampler.close = lambda: closed.append(sampler)  # type: ignore[attr-defined]
        samplers.append(sampler)
        return sampler

    monkeypatch.setattr(agent_loop, "build_sampler", separate_copy)
    trainer = AgentTrainer(_config(tmp_path), quiet=True)
    initial = _weights(trainer.policy)
    trainer.run()
    [sampler] = samplers
    assert sampler is not trainer.policy
    learned = trainer.policy.state_dict()
    assert any(not torch.equal(initial[name], learned[name]) for name in initial)
    # Skipping the push would leave the sampler at the initial weights.
    served = sampler.state_dict()
    assert all(torch.equal(served[name], learned[name]) for name in learned)
    assert closed == [sampler]  # the run released its sampler (a vLLM engine's core) once


def test_the_agent_loop_accepts_the_vllm_backend(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, "policy.backend=vllm")
    if importlib.util.find_spec("vllm") is None:  # the main venv: only the package is missing
        with pytest.raises(ConfigError) as caught:
            validate(config)
        assert "make setup-vllm" in str(caught.value)
        assert "rollout.workers" not in str(caught.value)
    else:
        validate(config)
