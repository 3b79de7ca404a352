"""Train/inference mismatch metrics and truncated importance sampling, on hand-built numbers
and on a real update (where the HF backend's mismatch is float rounding only)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from test_ppo import ONE_STEP, GradientRecorder, policy, sampled_batch
from turnrl.train.update.loss import ppo_clip_loss, truncated_is_weights
from turnrl.train.update.mismatch import mismatch_stats
from turnrl.train.update.ppo import ppo_update

LEARNER = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]])
SAMPLER = torch.tensor([[-1.5, -1.0], [-0.5, 0.0]])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])


def test_mismatch_stats_on_hand_built_rows() -> None:
    stats = mismatch_stats(LEARNER, SAMPLER, MASK)
    # token differences learner - sampler: 0.5, -1.0 (row 0) and 0.0 (row 1)
    assert stats["mismatch_logp_abs_mean"] == pytest.approx(0.5)
    assert stats["mismatch_logp_abs_max"] == pytest.approx(1.0)
    kl = ((math.exp(0.5) - 1.5) + (math.exp(-1.0) - 1.0 + 1.0) + 0.0) / 3
    assert stats["mismatch_kl"] == pytest.approx(kl)
    # sequence ratios exp(-0.5) and exp(0)
    assert stats["mismatch_seq_ratio_min"] == pytest.approx(math.exp(-0.5))
    assert stats["mismatch_seq_ratio_max"] == pytest.approx(1.0)
    assert stats["mismatch_seq_ratio_std"] == pytest.approx((1.0 - math.exp(-0.5)) / 2)


def test_under_ranks_the_statistics_are_the_global_batchs() -> None:
    """Rank 0 holds row 0, rank 1 row 1 (``gather``: every rank's value, in rank order):
    each rank gets the statistics of both rows, as one process computes them; and the
    share of corrected tokens counts every rank's tokens."""
    from turnrl.train.update.turn_correction import global_fraction

    sent: list[object] = []
    mismatch_stats(LEARNER[1:], SAMPLER[1:], MASK[1:], lambda mine: sent.append(mine) or [mine])
    split = mismatch_stats(LEARNER[:1], SAMPLER[:1], MASK[:1], lambda mine: [mine, sent[0]])
    assert split == pytest.approx(mismatch_stats(LEARNER, SAMPLER, MASK))
    assert split["mismatch_seq_ratio_std"] == pytest.approx((1.0 - math.exp(-0.5)) / 2)
    # rank 0: 2 of 8 tokens capped, rank 1: 2 of 4: 4 of 12 in all (not the mean of 1/4, 1/2)
    both = lambda mine: [mine, (0.5, 4)]  # noqa: E731
    assert global_fraction({"tis_corrected_frac": 0.25}, 8, both) == {"tis_corrected_frac": 1 / 3}
    assert global_fraction({}, 0, lambda mine: [mine, (0.0, 0)]) == {}


def test_mismatch_of_identical_log_probs_is_zero() -> None:
    stats = mismatch_stats(LEARNER, LEARNER, MASK)
    assert stats["mismatch_logp_abs_max"] == 0.0 and stats["mismatch_kl"] == 0.0
    assert stats["mismatch_seq_ratio_std"] == 0.0
    assert mismatch_stats(LEARNER, SAMPLER, torch.zeros_like(MASK)) == {}


def test_truncated_is_weights_cap_the_ratio_and_zero_padding() -> None:
    weights = truncated_is_weights(LEARNER, SAMPLER, MASK, cap=1.5)
    expected = torch.tensor([[1.5, math.exp(-1.0)], [1.0, 0.0]])
    torch.testing.assert_close(weights, expected)
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_is_weights(LEARNER, SAMPLER, MASK, cap=0.0)


def test_is_weights_scale_each_tokens_objective_and_gradient() -> None:
    logp = LEARNER.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -2.0])
    weight = MASK / 3.0
    is_weight = torch.tensor([[1.5, math.exp(-1.0)], [1.0, 0.0]])
    loss, stats = ppo_clip_loss(logp, LEARNER, adv, MASK, weight, is_weight_B_T=is_weight)
    # ratio 1 everywhere: objective = adv * is_weight, summed with weights 1/3
    assert float(loss.detach()) == pytest.approx(-(1.5 + math.exp(-1.0) - 2.0) / 3)
    assert stats["is_weight_mean"] == pytest.approx((1.5 + math.exp(-1.0) + 1.0) / 3)
    loss.backward()
    expected = torch.tensor([[-1.5 / 3, -math.exp(-1.0) / 3], [2.0 / 3, 0.0]])
    torch.testing.assert_close(logp.grad, expected)
    plain, _ = ppo_clip_loss(LEARNER, LEARNER, adv, MASK, weight)
    assert float(plain) == pytest.approx(-(1.0 + 1.0 - 2.0) / 3)


def test_update_logs_near_zero_mismatch_for_hf_sampling_and_the_planted_shift() -> None:
    model = policy()
    batch = sampled_batch(model, temperature=1.0)
    config = replace(ONE_STEP, log_mismatch=True)
    stats = ppo_update(
        model, GradientRecorder(model.parameters()), batch, config,
        temperature=1.0, reference=None, seed=0,
    )  # fmt: skip
    assert stats["mismatch_logp_abs_max"] < 1e-5  # the same forward, batched differently
    assert abs(stats["mismatch_seq_ratio_min"] - 1.0) < 1e-4
    shifted = replace(batch, old_logp_B_T=(batch.old_logp_B_T - 0.25) * batch.mask_B_T)
    stats = ppo_update(
        model, GradientRecorder(model.parameters()), shifted, config,
        temperature=1.0, reference=None, seed=0,
    )  # fmt: skip
    assert stats["mismatch_logp_abs_mean"] == pytest.approx(0.25, abs=1e-5)
    assert "mismatch_logp_abs_mean" not in ppo_update(
        model, GradientRecorder(model.parameters()), batch, ONE_STEP,
        temperature=1.0, reference=None, seed=0,
    )  # fmt: skip


def test_tis_reweights_the_gradient_by_the_capped_ratio() -> None:
    """A sampler whose log-probs are 0.25 higher than the learner's on every token: with TIS
    the PPO ratio is taken against the learner (1 at the first step) and each token is
    weighted exp(-0.25); the gradient is exp(-0.25) times the one without mismatch."""
    model = policy()
    batch = sampled_batch(model, temperature=1.0)
    plain = GradientRecorder(model.parameters())
    ppo_update(model, plain, batch, ONE_STEP, temperature=1.0, reference=None, seed=0)
    shifted = replace(batch, old_logp_B_T=(batch.old_logp_B_T + 0.25) * batch.mask_B_T)
    corrected = GradientRecorder(model.parameters())
    stats = ppo_update(
        model, corrected, shifted, replace(ONE_STEP, tis_cap=2.0),
        temperature=1.0, reference=None, seed=0,
    )  # fmt: skip
    assert stats["is_weight_mean"] == pytest.approx(math.exp(-0.25), abs=1e-5)
    for got, want in zip(corrected.steps[0], plain.steps[0], strict=True):
        torch.testing.assert_close(got, want * math.exp(-0.25), atol=1e-6, rtol=1e-4)
