"""``train.max_staleness = 1`` with ``policy.backend = "vllm"`` (#37): the sampler process
holds a vLLM engine of its own.

Runs in ``.venv-vllm`` (``make test-vllm``); skipped with the reason wherever ``import
vllm`` fails. Tiny model of head size 32 (``policy.heads = 2``), on the parity
environment from the untrained model (rewards that vary, so updates change the weights),
engines started eagerly (``policy.vllm_compile = false``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

vllm = pytest.importorskip("vllm", reason="vllm is not installed here (make setup-vllm)")

from turnrl.policy.vllm import VLLMPolicy  # noqa: E402
from turnrl.train.lifecycle import Lifecycle  # noqa: E402
from turnrl.train.online.asynchronous import AsyncOnlineTrainer, online_trainer  # noqa: E402
from turnrl.train.online.trainer import OnlineTrainer  # noqa: E402
from turnrl.train.process_tree import multiprocessing_services  # noqa: E402
from turnrl.train.validate import validate  # noqa: E402

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # a shared machine: no pinning

ON_VLLM = (
    "env.name=parity", "env.env_kwargs={}", "env.task_kwargs={}", "warm_start.steps=0",
    "policy.heads=2", "policy.backend=vllm", "policy.vllm_compile=false",
    "train.log_rollouts_every=1", "train.tis_cap=2.0",
)  # fmt: skip
"""The parity environment from the untrained model, sampled by vLLM."""


def records(run_dir: Path, step: int) -> list[dict[str, Any]]:
    path = run_dir / "rollouts" / f"step-{step:06d}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_three_steps_one_ahead(run: Path) -> None:
    """A 3-step agent loop at K = 1: steps 2 and 3 ran ahead without failures, no turn
    more than one version behind, step 1's sampler log-probs the learner's (within
    1e-3), and each turn sampled with the version served when it was called."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["agents_ahead"] for r in steps] == [0.0, 1.0, 1.0]
    assert [r["agent_failures"] for r in steps] == [0, 0, 0]
    assert all(r["staleness_max"] <= 1.0 for r in steps)
    assert steps[0]["staleness_max"] == 0.0 and steps[0]["mismatch_logp_abs_max"] < 1e-3
    for step in (2, 3):  # a turn samples with the version served when it was called
        assert {r["policy_version"] for r in records(run, step)} <= {step - 2, step - 1}


def test_the_sampler_process_samples_on_its_own_engine(
    tmp_path: Path, tiny_train, monkeypatch: pytest.MonkeyPatch
) -> None:
    """K = 1 on vLLM: the sampler process starts an engine from its copy of the weights
    and reloads every push into it. Step 1 (version 0 in both runs, same seeds) samples
    exactly the tokens and log-probs of the synchronous vLLM run; steps 2 and 4 sample
    one version behind (the schedule of a checkpoint every 2 steps: 0, 0, 2, 2) and the
    per-turn correction is logged. The learner's own engine (it evaluates) gets the
    weights only before an evaluation: at the start and at steps 2 and 4, not after
    every update. No process is left after the run (multiprocessing's resource tracker,
    which leaves with this process, aside)."""
    import psutil

    sync = OnlineTrainer(tiny_train(tmp_path / "sync", *ON_VLLM, "train.steps=1"), quiet=True)
    Lifecycle(sync).run()
    loaded: list[int] = []
    reload = VLLMPolicy.load_full_weights

    def counting(self: VLLMPolicy, weights: Any, version: int) -> None:
        loaded.append(version)  # this process's engine only: the sampler is spawned
        reload(self, weights, version)

    monkeypatch.setattr(VLLMPolicy, "load_full_weights", counting)
    me = psutil.Process()
    children_before = {p.pid for p in me.children(recursive=True)}
    config = tiny_train(tmp_path / "k1", *ON_VLLM, "train.max_staleness=1")
    validate(config)  # K >= 1 on "vllm": allowed (refused before the sampler held an engine)
    trainer = online_trainer(config, quiet=True)
    assert isinstance(trainer, AsyncOnlineTrainer)
    Lifecycle(trainer).run()

    assert loaded == [0, 2, 4]
    first = records(tmp_path / "k1", 1)
    assert {r.pop("policy_version") for r in first} == {0}
    plain = records(tmp_path / "sync", 1)
    for r in plain:
        r.pop("policy_version", None)
    assert first == plain
    rows = [
        json.loads(line) for line in (tmp_path / "k1" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["policy_version"] for r in steps] == [0, 0, 2, 2]
    assert [r["staleness_max"] for r in steps] == [0.0, 1.0, 0.0, 1.0]
    assert any(r["grad_norm"] > 0 for r in steps[:3])  # the weights moved: stale is stale
    assert all(0.0 <= r["tis_corrected_frac"] <= 1.0 for r in steps)
    assert {r["policy_version"] for r in records(tmp_path / "k1", 4)} == {2}
    left = {p.pid for p in me.children(recursive=True)} - children_before
    assert left - multiprocessing_services() == set()


def test_an_in_process_vllm_engine_is_refused_in_ranks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Ranks that each build an in-process vLLM engine deadlock in vLLM's process-group
    set-up (found with 2 ranks, K = 0 and K = 1): refused before anything starts,
    naming the field; one process and a vLLM server stay allowed."""
    from test_distributed import RECIPE, RUN
    from turnrl.errors import ConfigError
    from turnrl.train.config import RunConfig, load_config

    run = [*RUN, f"run_dir={tmp_path / 'run'}", "policy.heads=2", "policy.hidden=64"]
    validate(load_config(RunConfig, RECIPE, [*run, "policy.backend=vllm"]))  # one process
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=r"policy\.backend: 'vllm' cannot run in torchrun's 2"):
        validate(load_config(RunConfig, RECIPE, [*run, "policy.backend=vllm"]))
    server = ["policy.backend=vllm-server", "policy.server_url=http://127.0.0.1:9"]
    validate(load_config(RunConfig, RECIPE, [*run, *server]))


def test_the_agent_loop_serves_the_engine_one_step_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """K = 1 in the agent loop on vLLM: the gateways serve the run's engine, not the
    learner; the next step's agents sample from it during the update, and the engine is
    given the learner's weights after each update only (versions 1, 2, 3), under the
    gateway's hold. Steps 2 and 3 ran ahead, their turns at most one version behind, and
    step 1's engine log-probs are the learner's (both version 0). The engine compiles
    (the default): an eager one fails when the gateway's thread samples under 2 torch
    threads (test_vllm_backend.py's agent test)."""
    from test_agent_loop import agent_config
    from turnrl.train.agent.asynchronous import AsyncAgentTrainer, agent_trainer

    loaded: list[int] = []
    reload = VLLMPolicy.load_full_weights

    def counting(self: VLLMPolicy, weights: Any, version: int) -> None:
        loaded.append(version)
        reload(self, weights, version)

    monkeypatch.setattr(VLLMPolicy, "load_full_weights", counting)
    config = agent_config(
        tmp_path,
        "train.max_staleness=1", "train.tis_cap=2.0", "train.log_mismatch=true",
        "policy.backend=vllm", "policy.heads=2",  # compiled: see test_vllm_backend.py's
        "train.steps=3", "train.eval_every=0", "train.checkpoint_every=0",
    )  # fmt: skip
    validate(config)  # K = 1 with [agent] on "vllm": allowed (a config error before)
    trainer = agent_trainer(config, quiet=True)
    assert isinstance(trainer, AsyncAgentTrainer)
    run = trainer.run()
    assert isinstance(trainer.served, VLLMPolicy) and trainer.served is not trainer.policy
    assert trainer.served.policy_version == 3
    assert loaded == [1, 2, 3]
    assert_three_steps_one_ahead(run)
