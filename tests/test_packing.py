"""The rows layout without padding, and ``max_tokens_per_batch`` as the one size knob.

Packed rows (bins of rows per forward, positions restarting at 0 per row, attention
block-diagonal causal) give the padded layout's per-token log-probs, loss and gradients
(tiny Qwen2 in float32, full weights and LoRA, several token budgets); the tree
layout's forwards cut by the budget give the uncut update; the default update (tree,
2048) is the tree path's, bit for bit; the budget is a checked config field."""

from __future__ import annotations

import functools
import itertools
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from test_tree_update import _batch, _policy, _reference, _run
from turnrl.config_toml import load_config
from turnrl.errors import ConfigError
from turnrl.policy import HFPolicy, packing
from turnrl.policy.lora import lora_policy
from turnrl.policy.packing import packed_logprobs, token_budget_groups
from turnrl.policy.tree_layout import TreeLayout, split_rows
from turnrl.train.config import RunConfig
from turnrl.train.iterate.config import IterateConfig
from turnrl.train.update.loss import ppo_clip_loss
from turnrl.train.update.minibatches import tree_minibatches
from turnrl.train.update.mismatch import learner_logprobs
from turnrl.train.update.ppo import PPOConfig
from turnrl.train.validate import validate

torch.set_num_threads(1)

TEMPERATURE = 0.9  # _run's


def test_packed_layout_hand_built() -> None:
    # rows "1 2 | 4" and "3 | 5 6": one sequence 1 2 4 3 5 6
    layout = TreeLayout.packed([[1, 2], [3]], [[4], [5, 6]])
    assert layout.ids == [1, 2, 4, 3, 5, 6]
    assert layout.depth == [0, 1, 2, 0, 1, 2]  # position ids restart with each row
    assert layout.parent == [-1, 0, 1, -1, 3, 4]
    assert layout.end == [3, 3, 3, 6, 6, 6]
    assert layout.nodes == [[2], [4, 5]]  # each row's response tokens
    assert layout.last == [2, 5]
    allowed = [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 1, 1, 1],
    ]  # block-diagonal causal: a token sees its own row's earlier tokens only
    assert layout.ancestor_mask(torch.device("cpu")).int().tolist() == allowed
    # identical rows stay two rows (the tree layout would merge them)
    twice = TreeLayout.packed([[7, 8], [7, 8]], [[9], [9]])
    assert twice.size == 6 and TreeLayout.build([[7, 8], [7, 8]], [[9], [9]]).size == 3
    with pytest.raises(ValueError, match="non-empty context"):
        TreeLayout.packed([[]], [[1]])


def test_token_budget_groups_hand_built() -> None:
    # budget 8: 3 + 5 fit; 2 + 9 do not; 9 alone exceeds it and is its own group
    assert token_budget_groups([3, 5, 2, 9, 1], 8) == [[0, 1], [2], [3], [4]]
    assert token_budget_groups([3, 5, 2, 9, 1], 100) == [[0, 1, 2, 3, 4]]
    assert token_budget_groups([], 4) == []
    with pytest.raises(ValueError, match="max_tokens"):
        token_budget_groups([1], 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), max_size=25), st.integers(1, 60))
def test_token_budget_groups_invariants(sizes: list[int], budget: int) -> None:
    groups = token_budget_groups(sizes, budget)
    assert [i for g in groups for i in g] == list(range(len(sizes)))  # in order, all once
    for g in groups:
        assert len(g) == 1 or sum(sizes[i] for i in g) <= budget
    for g, following in itertools.pairwise(groups):  # greedy: none could join
        assert sum(sizes[i] for i in g) + sizes[following[0]] > budget


@functools.cache
def _shared_policy() -> HFPolicy:
    """One tiny policy for the no-grad examples (built once)."""
    return _policy()


def _bin_positions(sizes: list[int]) -> int:
    """Positions one packed forward of rows of these sizes runs: bins (filled in order
    up to the longest row) x the longest bin."""
    bins = token_budget_groups(sizes, max(sizes))
    return len(bins) * max(sum(sizes[i] for i in b) for b in bins)


def test_packed_forward_hand_built() -> None:
    # rows of 5, 2, 3 and 4 tokens: bins of at most 5 are [0], [1, 2], [3], so one
    # forward of 3 x 5 positions (the last bin's one padding position) against the
    # padded layout's 4 x 5
    policy = _shared_policy()
    contexts, responses = [[1, 2, 3], [4], [5, 6], [7, 8, 9]], [[10, 11], [12], [13], [14]]
    with torch.no_grad():
        padded_B_T, mask_B_T = policy.response_logprobs(contexts, responses, temperature=0.7)
        out = policy.packed_logprobs(contexts, responses, temperature=0.7)
    assert out.tokens_computed == 3 * 5 == _bin_positions([5, 2, 3, 4])
    assert torch.equal(out.mask_B_T, mask_B_T)
    assert torch.allclose(out.logp_B_T, padded_B_T, atol=1e-5, rtol=0)


def _lora(policy: HFPolicy) -> HFPolicy:
    policy = lora_policy(policy, rank=2, alpha=4.0, targets=["q_proj", "v_proj"])
    with torch.no_grad():  # B = 0 at first would zero every adapter gradient but B's
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    return policy


@settings(max_examples=15, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.lists(st.integers(1, 90), min_size=1, max_size=12),
            st.lists(st.integers(1, 90), min_size=0, max_size=8),
        ),
        min_size=1,
        max_size=7,
    ),
    budget=st.integers(1, 60),
)
def test_packed_logprobs_equal_the_padded_ones(rows, budget) -> None:
    policy = _shared_policy()
    contexts = [c for c, _ in rows]
    responses = [r for _, r in rows]
    with torch.no_grad():
        padded_B_T, mask_B_T = policy.response_logprobs(contexts, responses, temperature=0.7)
        sizes = [len(c) + len(r) for c, r in rows]
        got_B_T = torch.zeros_like(padded_B_T)
        computed = expected = 0
        for group in token_budget_groups(sizes, budget):
            if any(responses[i] for i in group):  # else nothing to score: no forward
                expected += _bin_positions([sizes[i] for i in group])
            out = policy.packed_logprobs(
                [contexts[i] for i in group], [responses[i] for i in group], temperature=0.7
            )
            got_B_T[group, : out.logp_B_T.shape[1]] = out.logp_B_T
            assert torch.equal(out.mask_B_T, mask_B_T[group, : out.mask_B_T.shape[1]])
            computed += out.tokens_computed
    assert computed == expected  # the rows' tokens and the bins' tails
    assert torch.allclose(got_B_T, padded_B_T, atol=1e-5, rtol=0)
    assert torch.equal(got_B_T[mask_B_T == 0], torch.zeros_like(got_B_T[mask_B_T == 0]))


def _assert_close_steps(expected, got) -> None:
    assert len(expected) == len(got) > 0
    for e_step, g_step in zip(expected, got, strict=True):
        assert len(e_step) == len(g_step) > 0
        for e, g in zip(e_step, g_step, strict=True):
            assert torch.allclose(e, g, atol=1e-5, rtol=1e-5)


LOSS_STATS = ("loss", "pg_loss", "kl_loss", "kl_ref", "ratio_mean", "clip_frac", "n_tokens")


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_packed_rows_update_has_the_padded_updates_loss_and_gradients(
    lora, aggregation, monkeypatch
) -> None:
    base = _policy()
    batch = _batch(base, aggregation)
    reference = _reference(base)
    policy = _lora(base) if lora else base
    config = PPOConfig(minibatch_size=5, kl_coef=0.3, update="rows", max_tokens_per_batch=10**6)
    with monkeypatch.context() as patch:  # the padded layout: one forward per mini-batch
        patch.setattr(packing, "model_attention", lambda model: "flash_attention_2")
        padded_steps, padded = _run(policy, batch, config, reference)
    assert sum(float(g.norm()) for g in padded_steps[0]) > 1e-3
    sizes = [len(c) + len(r) for c, r in zip(batch.contexts, batch.responses, strict=True)]
    # one forward per mini-batch; about one row per forward; every row alone; and below
    for budget in (10**6, 2 * max(sizes), max(sizes), min(sizes)):
        steps, packed = _run(policy, batch, replace(config, max_tokens_per_batch=budget), reference)
        _assert_close_steps(padded_steps, steps)
        for key in LOSS_STATS:
            assert packed[key] == pytest.approx(padded[key], rel=1e-5, abs=1e-6), (budget, key)
        computed = packed["update_tokens_computed"]
        assert sum(sizes) <= computed <= padded["update_tokens_computed"]
        if budget < 2 * min(sizes):  # a row per forward: no padding at all
            assert computed == sum(sizes)


@settings(max_examples=6, deadline=None)
@given(budget=st.integers(1, 400))
def test_tree_update_with_a_budget_equals_the_uncut_one(budget) -> None:
    policy = _policy()
    batch = _batch(policy, "token-mean")
    reference = _reference(policy)
    config = PPOConfig(minibatch_size=5, kl_coef=0.3, update="tree", max_tokens_per_batch=10**6)
    whole_steps, whole = _run(policy, batch, config, reference)
    cut_steps, cut = _run(policy, batch, replace(config, max_tokens_per_batch=budget), reference)
    _assert_close_steps(whole_steps, cut_steps)
    for key in LOSS_STATS:
        assert cut[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-6), key
    assert cut["update_tokens_computed"] >= whole["update_tokens_computed"]


def test_the_default_update_is_the_tree_path_bit_for_bit() -> None:
    """``PPOConfig()`` (tree layout, 2048 positions) runs the tree path as before: its
    mini-batches, its forwards cut by ``split_rows``, the same gradients exactly."""
    policy = _policy()
    batch = _batch(policy, "token-mean")
    config = PPOConfig(minibatch_size=5)
    assert (config.update, config.max_tokens_per_batch) == ("tree", 2048)
    steps, _ = _run(policy, batch, config, None)
    generator = torch.Generator().manual_seed(3)  # _run's seed
    minibatches = tree_minibatches(batch.tree_B.tolist(), 5, generator)
    assert len(steps) == len(minibatches) > 1
    parameters = list(policy.parameters())
    policy.model.train()
    for rows, recorded in zip(minibatches, steps, strict=True):
        for p in parameters:
            p.grad = None
        contexts = [batch.contexts[i] for i in rows]
        responses = [batch.responses[i] for i in rows]
        for group in split_rows(contexts, responses, 2048):
            part = [rows[g] for g in group]
            out = policy.tree_logprobs(
                [batch.contexts[i] for i in part],
                [batch.responses[i] for i in part],
                temperature=TEMPERATURE,
            )
            width = out.logp_B_T.shape[1]
            loss, _ = ppo_clip_loss(
                out.logp_B_T,
                batch.old_logp_B_T[part, :width],
                batch.adv_B[part],
                out.mask_B_T,
                batch.weight_B_T[part, :width] * len(minibatches),
                clip_low=config.clip_low,
                clip_high=config.clip_high,
                clip_factor_B=batch.clip_factor_B[part],
            )
            loss.backward()
        for p, g in zip(parameters, recorded, strict=True):
            assert torch.equal(p.grad, g)
    policy.model.eval()


def test_packing_falls_back_to_padding_without_a_4d_mask(monkeypatch) -> None:
    policy = _policy()
    contexts, responses = [[1, 2, 3], [4]], [[5, 6], [7, 8, 9]]
    with torch.no_grad():
        padded_B_T, _ = policy.response_logprobs(contexts, responses, temperature=0.7)
        # as a model loaded with flash_attention_2 reports itself (a GPU-only kernel)
        monkeypatch.setattr(packing, "model_attention", lambda model: "flash_attention_2")
        out = packed_logprobs(
            policy.model,
            contexts,
            responses,
            temperature=0.7,
            pad_token_id=policy.pad_token_id,
            device=policy.device,
        )
    assert torch.equal(out.logp_B_T, padded_B_T)
    assert out.tokens_computed == 2 * 5  # the padding counted


@pytest.mark.parametrize("value", ["0", "-3", "1.5", "true"])
def test_the_budget_is_a_checked_positive_int(value: str) -> None:
    for section, config_class in (("train", RunConfig), ("improve", IterateConfig)):
        overrides = [f"{section}.max_tokens_per_batch={value}"]
        with pytest.raises(ConfigError, match=rf"{section}\.max_tokens_per_batch"):
            validate(load_config(config_class, None, overrides), overrides=overrides)
    ok = ["train.max_tokens_per_batch=1", "train.update=rows"]
    validate(load_config(RunConfig, None, ok), overrides=ok)


def counting_forwards(policy, monkeypatch) -> list[int]:
    """The tokens of each forward ``policy.response_logprobs`` runs from now on."""
    forwards: list[int] = []
    real = policy.response_logprobs

    def counted(contexts, responses, *, temperature):
        forwards.append(sum(len(c) + len(r) for c, r in zip(contexts, responses, strict=True)))
        return real(contexts, responses, temperature=temperature)

    monkeypatch.setattr(policy, "response_logprobs", counted)
    return forwards


def test_the_mismatch_pass_is_cut_by_the_token_budget(monkeypatch) -> None:
    policy = _shared_policy()
    batch = _batch(policy, "token-mean")
    whole = learner_logprobs(policy, batch, temperature=0.9, max_tokens=10**6)
    forwards = counting_forwards(policy, monkeypatch)
    cut = learner_logprobs(policy, batch, temperature=0.9, max_tokens=200)
    sizes = [len(c) + len(r) for c, r in zip(batch.contexts, batch.responses, strict=True)]
    assert len(forwards) == len(token_budget_groups(sizes, 200)) > 1
    assert all(tokens <= 200 for tokens in forwards)  # no row here is longer than 200
    assert torch.allclose(cut, whole, atol=1e-5, rtol=0)
    assert torch.equal(whole == 0, batch.mask_B_T == 0)


def test_the_mismatch_pass_runs_as_many_forwards_as_the_busiest_rank(monkeypatch) -> None:
    """Under FSDP2 every forward is a collective: a rank with fewer forwards in the
    learner's pass than the busiest runs the difference on its shortest row, and its
    log-probs are those of the pass without padding, exactly."""
    policy = _shared_policy()
    batch = _batch(policy, "token-mean")
    alone = learner_logprobs(policy, batch, temperature=0.9, max_tokens=200)
    forwards = counting_forwards(policy, monkeypatch)
    asked: list[int] = []

    def busiest(count: int) -> int:
        asked.append(count)
        return count + 3

    padded = learner_logprobs(
        policy, batch, temperature=0.9, max_tokens=200, forwards_of_busiest=busiest
    )
    sizes = [len(c) + len(r) for c, r in zip(batch.contexts, batch.responses, strict=True)]
    mine = len(token_budget_groups(sizes, 200))
    assert asked == [mine] and len(forwards) == mine + 3
    assert forwards[mine:] == [min(sizes)] * 3
    assert torch.equal(padded, alone)
