"""The learner's memory savers change nothing but memory: gradient checkpointing per
decoder layer and log-probs scored in chunks of tokens give the log-probs, loss and
gradients of the plain update (tiny Qwen2 in float32, rows and tree layouts, full
weights and LoRA, temperature 0.7), and are off again after the update."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from test_tree_update import _batch as _tree_batch
from test_tree_update import _policy as _tree_policy
from test_tree_update import _reference, _run
from turnrl.config_toml import load_config
from turnrl.errors import ConfigError
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.policy.logprobs import chunked_scored_tokens
from turnrl.policy.lora import lora_policy
from turnrl.policy.memory_savers import memory_savers
from turnrl.train.config import RunConfig
from turnrl.train.iterate.config import IterateConfig
from turnrl.train.update.memory import ActivationMeter
from turnrl.train.update.ppo import PPOConfig
from turnrl.train.validate import validate

torch.set_num_threads(1)

TEMPERATURE = 0.7
# Shared prompts, branching responses, a repeated sample and a second turn extending the
# first row's context: 13 response tokens, 10 distinct ones in the tree layout.
CONTEXTS = [[1, 2, 3], [1, 2, 3], [1, 2, 3, 4, 5, 7], [5, 6], [1, 2, 3]]
RESPONSES = [[4, 5, 9], [4, 6], [8, 2, 2, 3], [1, 1], [4, 5]]
ADVANTAGE = [0.5, -1.0, 2.0, 1.5, -0.25]
LAYOUTS = ("rows", "tree")


def _policy(lora: bool) -> HFPolicy:
    policy = build_tiny_policy(0)
    if lora:
        policy = lora_policy(policy, rank=2, alpha=4.0, targets=["q_proj", "v_proj"])
        # B = 0 at first would make every adapter gradient but B's zero: move off it
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    policy.model.train()
    return policy


def _logprobs(policy: HFPolicy, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    if layout == "tree":
        out = policy.tree_logprobs(CONTEXTS, RESPONSES, temperature=TEMPERATURE)
        return out.logp_B_T, out.mask_B_T
    return policy.response_logprobs(CONTEXTS, RESPONSES, temperature=TEMPERATURE)


def _loss_and_grads(
    policy: HFPolicy, layout: str, *, checkpointing: bool = False, chunk: int = 0
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Log-probs, a policy-gradient-shaped loss and its gradients, in train mode."""
    parameters = list(policy.parameters())
    for p in parameters:
        p.grad = None
    with memory_savers(policy, gradient_checkpointing=checkpointing, logprob_chunk_tokens=chunk):
        logp_B_T, mask_B_T = _logprobs(policy, layout)
        weight_B_T = torch.tensor(ADVANTAGE)[:, None] * mask_B_T
        loss = -(logp_B_T * weight_B_T).sum() / mask_B_T.sum()
        loss.backward()
    return logp_B_T.detach(), loss.detach(), [p.grad.clone() for p in parameters]


def _assert_same(a, b) -> None:
    logp_a, loss_a, grads_a = a
    logp_b, loss_b, grads_b = b
    assert torch.allclose(logp_a, logp_b, atol=1e-6, rtol=0)
    assert torch.allclose(loss_a, loss_b, atol=1e-6, rtol=0)
    assert len(grads_a) == len(grads_b) > 0
    for ga, gb in zip(grads_a, grads_b, strict=True):
        assert torch.allclose(ga, gb, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(layout, lora) -> None:
    policy = _policy(lora)
    plain = _loss_and_grads(policy, layout)
    _assert_same(plain, _loss_and_grads(policy, layout, checkpointing=True))
    assert not policy.model.is_activation_checkpointing  # off again after the update


@settings(max_examples=12, deadline=None)
@given(chunk=st.integers(1, 15), lora=st.booleans(), layout=st.sampled_from(LAYOUTS))
def test_chunked_logprobs_give_the_same_loss_and_gradients(chunk, lora, layout) -> None:
    # 13 scored tokens (rows), 10 (tree): chunks of 1..15 include sizes that divide
    # neither and ones larger than all of them
    policy = _policy(lora)
    _assert_same(_loss_and_grads(policy, layout), _loss_and_grads(policy, layout, chunk=chunk))
    assert policy.logprob_chunk_tokens == 0


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_both_savers_together_give_the_same_loss_and_gradients(layout, lora) -> None:
    policy = _policy(lora)
    plain = _loss_and_grads(policy, layout)
    _assert_same(plain, _loss_and_grads(policy, layout, checkpointing=True, chunk=5))


def _saved(policy: HFPolicy, layout: str, **savers) -> tuple[int, int]:
    """(bytes autograd keeps for the backward, most rows of any saved [.., vocab] tensor)
    over one forward and backward."""
    vocab = policy.model.config.vocab_size
    rows = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        weight = isinstance(tensor, torch.nn.Parameter) or isinstance(
            tensor._base, torch.nn.Parameter
        )
        if tensor.dim() and tensor.shape[-1] == vocab and not weight:
            rows.append(tensor.numel() // vocab)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _loss_and_grads(policy, layout, **savers)
    meter = ActivationMeter(policy.model)  # its own hooks: only the innermost ones run
    with meter.forward():
        _loss_and_grads(policy, layout, **savers)
    return meter.peak_bytes, max(rows)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_savers_keep_less_for_the_backward(layout) -> None:
    policy = _policy(lora=False)
    plain_bytes, plain_rows = _saved(policy, layout)
    checkpointed_bytes, _ = _saved(policy, layout, checkpointing=True)
    chunked_bytes, chunked_rows = _saved(policy, layout, chunk=3)
    both_bytes, _ = _saved(policy, layout, checkpointing=True, chunk=3)
    # the plain update keeps the log-softmax of every token it scores: rows, the 13
    # response tokens of its 5 rows (the padded positions from the earliest response's
    # predictor on, 5 x 9 = 45, are computed but not kept); tree: its 10 distinct
    # response nodes
    assert plain_rows == {"rows": 13, "tree": 10}[layout]
    assert chunked_rows <= 3  # no whole [tokens x vocab] tensor is kept
    assert checkpointed_bytes < plain_bytes / 3
    assert chunked_bytes < plain_bytes
    assert both_bytes < min(checkpointed_bytes, chunked_bytes)


def test_chunked_logprobs_without_grad_and_of_nothing() -> None:
    head = torch.nn.Linear(4, 7)
    hidden_N_H = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    targets_N = torch.tensor([0, 6, 3, 3, 1])
    whole_N_V = torch.log_softmax(head(hidden_N_H) / 0.7, -1)
    whole_N = whole_N_V.gather(-1, targets_N[:, None])[:, 0]
    with torch.no_grad():
        chunked = chunked_scored_tokens(head, hidden_N_H, targets_N, 0.7, 2)
    assert torch.allclose(chunked.logp, whole_N, atol=1e-6, rtol=0)
    entropy_N = -(whole_N_V.exp() * whole_N_V).sum(-1)
    assert torch.allclose(chunked.entropy, entropy_N, atol=1e-6, rtol=0)
    empty = chunked_scored_tokens(head, hidden_N_H[:0], targets_N[:0], 0.7, 2)
    assert empty.logp.shape == empty.entropy.shape == (0,)
    assert empty.logp.dtype == torch.float32
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_scored_tokens(head, hidden_N_H, targets_N, 0.7, 0)


def test_savers_are_off_again_after_an_error_and_sampling_is_unchanged() -> None:
    policy = _policy(lora=True)
    policy.model.eval()
    before = policy.sample([[1, 2, 3]], max_new_tokens=6, temperature=1.0, seed=4)
    savers = memory_savers(policy, gradient_checkpointing=True, logprob_chunk_tokens=2)
    with pytest.raises(RuntimeError, match="inside"), savers:
        assert policy.model.is_activation_checkpointing
        assert policy.logprob_chunk_tokens == 2
        raise RuntimeError("inside")
    assert not policy.model.is_activation_checkpointing
    assert policy.logprob_chunk_tokens == 0
    after = policy.sample([[1, 2, 3]], max_new_tokens=6, temperature=1.0, seed=4)
    assert after[0].response_ids == before[0].response_ids
    assert after[0].logprobs == before[0].logprobs
    with pytest.raises(ValueError, match="logprob_chunk_tokens"):
        memory_savers(policy, logprob_chunk_tokens=-1).__enter__()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ppo_update_with_both_savers_takes_the_same_step(layout) -> None:
    policy = _tree_policy()
    batch = _tree_batch(policy, "token-mean")
    reference = _reference(policy)
    config = PPOConfig(minibatch_size=64, kl_coef=0.3, update=layout, max_tokens_per_batch=120)
    (plain,), plain_stats = _run(policy, batch, config, reference)
    saving = replace(config, gradient_checkpointing=True, logprob_chunk_tokens=7)
    (saved,), saved_stats = _run(policy, batch, saving, reference)
    assert sum(float(g.norm()) for g in plain) > 1e-3
    for p, s in zip(plain, saved, strict=True):
        assert torch.allclose(p, s, atol=1e-6, rtol=1e-5)
    for key in ("loss", "pg_loss", "kl_loss", "ratio_mean", "clip_frac", "n_tokens"):
        assert saved_stats[key] == pytest.approx(plain_stats[key], rel=1e-6, abs=1e-6), key
    assert saved_stats["update_activation_mib"] < plain_stats["update_activation_mib"] / 2
    assert not policy.model.is_activation_checkpointing and policy.logprob_chunk_tokens == 0


def test_config_fields_are_checked_and_may_change_on_resume() -> None:
    def check(*overrides: str) -> None:
        validate(load_config(RunConfig, None, list(overrides)), overrides=overrides)

    check("train.gradient_checkpointing=true", "train.logprob_chunk_tokens=4096")
    with pytest.raises(ConfigError, match=r"train\.logprob_chunk_tokens"):
        check("train.logprob_chunk_tokens=-1")
    with pytest.raises(ConfigError, match=r"train\.logprob_chunk_tokens: must be 0 with"):
        check("train.sharding=fsdp2", "train.logprob_chunk_tokens=4096")
    for name in ("gradient_checkpointing", "logprob_chunk_tokens"):
        assert f"train.{name}" in RunConfig.MAY_CHANGE_ON_RESUME
        assert f"improve.{name}" in IterateConfig.MAY_CHANGE_ON_RESUME


def test_the_warm_start_trains_with_the_update_sections_savers(tmp_path, monkeypatch) -> None:
    from turnrl.train.run import RunDirectory
    from turnrl.train.update import sft

    seen: list[tuple[bool, int]] = []

    def fake_warm_start(policy: HFPolicy, *args, **kwargs) -> list[float]:
        seen.append((policy.model.is_activation_checkpointing, policy.logprob_chunk_tokens))
        return [1.0]

    monkeypatch.setattr(sft, "supervised_warm_start", fake_warm_start)
    overrides = [f"run_dir={tmp_path}", "warm_start.steps=2", "train.gradient_checkpointing=true"]
    config = load_config(RunConfig, None, [*overrides, "train.logprob_chunk_tokens=7"])
    policy = _policy(lora=True)
    run = RunDirectory.open(config, quiet=True)
    run.start()
    run.warm_start(policy, config.warm_start, list, seed=0, update=config.train)
    run.warm_start(policy, config.warm_start, list, seed=0)  # no update section: none
    run.close()
    assert seen == [(True, 7), (False, 0)]
    assert not policy.model.is_activation_checkpointing and policy.logprob_chunk_tokens == 0
