"""PPO-clip token loss and aggregation weights: hand-computed cases and invariants."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from turnrl.train.update.loss import aggregation_weights, kl_penalty, ppo_clip_loss

torch.set_num_threads(1)


def _row(ratios: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Current and old log-probs (1, T) whose ratio is ``ratios``; current has grad."""
    old = torch.log(torch.full((1, len(ratios)), 0.5))
    new = (old + torch.log(torch.tensor([ratios]))).clone().requires_grad_(True)
    return new, old


def _full_mask(b: int, t: int) -> torch.Tensor:
    return torch.ones(b, t, dtype=torch.bool)


# --------------------------------------------------------------------------- clipping


def test_positive_advantage_clips_above_only() -> None:
    logp, old = _row([0.5, 1.0, 1.5])
    mask = _full_mask(1, 3)
    weights = aggregation_weights(mask, "token-mean")
    loss, stats = ppo_clip_loss(logp, old, torch.tensor([2.0]), mask, weights)
    # min(r*A, clip(r)*A) with A=2, clip [0.8, 1.2]: 1.0, 2.0, 2.4 (clipped)
    assert loss.item() == pytest.approx(-(1.0 + 2.0 + 2.4) / 3, abs=1e-6)
    loss.backward()
    # d loss / d logp = -w * A * r where unclipped, 0 where the clipped term is active
    assert logp.grad.tolist()[0] == pytest.approx([-1 / 3, -2 / 3, 0.0], abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(1 / 3)
    assert stats["clip_frac_high"] == pytest.approx(1 / 3)
    assert stats["clip_frac_low"] == 0.0
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["n_tokens"] == 3.0


def test_negative_advantage_clips_below_only() -> None:
    logp, old = _row([0.5, 1.0, 1.5])
    mask = _full_mask(1, 3)
    weights = aggregation_weights(mask, "token-mean")
    loss, stats = ppo_clip_loss(logp, old, torch.tensor([-2.0]), mask, weights)
    # A=-2: min(-1.0, -1.6) = -1.6 (clipped), -2.0, min(-3.0, -2.4) = -3.0
    assert loss.item() == pytest.approx((1.6 + 2.0 + 3.0) / 3, abs=1e-6)
    loss.backward()
    assert logp.grad.tolist()[0] == pytest.approx([0.0, 2 / 3, 1.0], abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(1 / 3)
    assert stats["clip_frac_low"] == pytest.approx(1 / 3)
    assert stats["clip_frac_high"] == 0.0


def test_asymmetric_clip_higher() -> None:
    logp, old = _row([1.25])
    mask = _full_mask(1, 1)
    weights = aggregation_weights(mask, "token-mean")
    sym, _ = ppo_clip_loss(logp, old, torch.tensor([1.0]), mask, weights)
    higher, _ = ppo_clip_loss(
        logp, old, torch.tensor([1.0]), mask, weights, clip_low=0.2, clip_high=0.28
    )
    assert sym.item() == pytest.approx(-1.2, abs=1e-6)
    assert higher.item() == pytest.approx(-1.25, abs=1e-6)


def test_clip_factor_narrows_and_widens_bounds() -> None:
    old = torch.log(torch.full((2, 2), 0.5))
    logp = (old + torch.log(torch.tensor([[0.7, 1.3], [0.7, 1.3]]))).requires_grad_(True)
    mask = _full_mask(2, 2)
    weights = aggregation_weights(mask, "token-mean")
    factor = torch.tensor([0.5, 2.0])  # bounds [0.9, 1.1] and [0.6, 1.4]
    loss, stats = ppo_clip_loss(
        logp, old, torch.tensor([1.0, 1.0]), mask, weights, clip_factor_B=factor
    )
    # row 0: 0.7, min(1.3, 1.1) = 1.1; row 1: 0.7, 1.3 (inside the wider range)
    assert loss.item() == pytest.approx(-(0.7 + 1.1 + 0.7 + 1.3) / 4, abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(1 / 4)
    neg, neg_stats = ppo_clip_loss(
        logp, old, torch.tensor([-1.0, -1.0]), mask, weights, clip_factor_B=factor
    )
    # row 0: min(-0.7, -0.9) = -0.9 (clipped), -1.3; row 1: -0.7, -1.3
    assert neg.item() == pytest.approx((0.9 + 1.3 + 0.7 + 1.3) / 4, abs=1e-6)
    assert neg_stats["clip_frac_low"] == pytest.approx(1 / 4)


def test_padding_with_inf_is_ignored() -> None:
    logp = torch.tensor([[math.log(0.5), -math.inf]], requires_grad=True)
    old = torch.tensor([[math.log(0.5), -math.inf]])
    mask = torch.tensor([[True, False]])
    weights = aggregation_weights(mask, "token-mean")
    loss, _ = ppo_clip_loss(
        logp,
        old,
        torch.tensor([1.0]),
        mask,
        weights,
        ref_logp_B_T=torch.tensor([[math.log(0.5), math.nan]]),
        kl_coef=1.0,
    )
    loss.backward()
    assert loss.item() == pytest.approx(-1.0, abs=1e-6)
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[0, 1].item() == 0.0


def test_shape_mismatch_is_a_clear_error() -> None:
    mask = _full_mask(2, 3)
    with pytest.raises(ValueError, match="adv_B has shape"):
        ppo_clip_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), mask, torch.zeros(2, 3))


# --------------------------------------------------------------------------- KL


def test_k3_value_on_known_case() -> None:
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25)]])
    # k3 = exp(ref - logp) - (ref - logp) - 1 = 0.5 - log(0.5) - 1 = log 2 - 0.5
    expected_k3 = math.log(2) - 0.5
    assert kl_penalty(logp, ref).item() == pytest.approx(expected_k3, abs=1e-6)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(math.log(2), abs=1e-6)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2, abs=1e-6)
    mask = _full_mask(1, 1)
    weights = aggregation_weights(mask, "token-mean")
    loss, stats = ppo_clip_loss(
        logp, logp.detach(), torch.tensor([0.0]), mask, weights, ref_logp_B_T=ref, kl_coef=0.1
    )
    assert loss.item() == pytest.approx(0.1 * expected_k3, abs=1e-6)
    assert stats["kl_ref"] == pytest.approx(expected_k3, abs=1e-6)
    loss.backward()
    # d k3 / d logp = 1 - exp(ref - logp) = 0.5
    assert logp.grad.item() == pytest.approx(0.1 * 0.5, abs=1e-6)


def test_unknown_kl_estimator() -> None:
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k9")


@given(
    st.lists(st.floats(-5, 5), min_size=1, max_size=8),
    st.lists(st.floats(-5, 5), min_size=1, max_size=8),
)
@settings(max_examples=50, deadline=None)
def test_k3_is_nonnegative_and_zero_on_equality(a: list[float], b: list[float]) -> None:
    n = min(len(a), len(b))
    logp, ref = torch.tensor([a[:n]]), torch.tensor([b[:n]])
    assert (kl_penalty(logp, ref) >= -1e-6).all()
    assert kl_penalty(logp, logp).abs().max().item() == 0.0


# --------------------------------------------------------------------------- weights

# Row lengths 2, 1, 0, 3 in a (4, 3) batch.
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)


def test_token_mean_weights() -> None:
    w = aggregation_weights(MASK, "token-mean")
    assert torch.allclose(w, MASK.float() / 6)


def test_seq_mean_token_mean_weights() -> None:
    w = aggregation_weights(MASK, "seq-mean-token-mean")
    expected = torch.tensor([[1 / 6, 1 / 6, 0], [1 / 3, 0, 0], [0, 0, 0], [1 / 9, 1 / 9, 1 / 9]])
    assert torch.allclose(w, expected)


def test_rollout_mean_weights() -> None:
    # Rollouts: rows {0}, {1, 3}, {2}. Rollout 9 has no tokens and is not counted.
    w = aggregation_weights(MASK, "rollout-mean", torch.tensor([7, 3, 9, 3]))
    expected = torch.tensor([[1 / 4, 1 / 4, 0], [1 / 8, 0, 0], [0, 0, 0], [1 / 8, 1 / 8, 1 / 8]])
    assert torch.allclose(w, expected)


def test_rollout_mean_needs_index_and_modes_are_checked() -> None:
    with pytest.raises(ValueError, match="rollout_index_B"):
        aggregation_weights(MASK, "rollout-mean")
    with pytest.raises(ValueError, match="unknown aggregation mode"):
        aggregation_weights(MASK, "sum")


def test_empty_batch_weights_are_zero() -> None:
    mask = torch.zeros(2, 3, dtype=torch.bool)
    for mode in ("token-mean", "seq-mean-token-mean"):
        assert aggregation_weights(mask, mode).sum().item() == 0.0
    assert aggregation_weights(mask, "rollout-mean", torch.tensor([0, 1])).sum().item() == 0.0


MODES = ["token-mean", "seq-mean-token-mean", "rollout-mean"]


@st.composite
def batches(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    b = draw(st.integers(1, 7))
    t = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, t), min_size=b, max_size=b))
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    old = -torch.rand(b, t, generator=gen) * 3 - 0.01
    new = old + (torch.rand(b, t, generator=gen) - 0.5)
    ref = old + (torch.rand(b, t, generator=gen) - 0.5)
    adv = torch.randn(b, generator=gen)
    rollout = torch.tensor(draw(st.lists(st.integers(0, 3), min_size=b, max_size=b)))
    factor = torch.rand(b, generator=gen) * 2
    return {
        "mask": mask,
        "old": old,
        "new": new,
        "ref": ref,
        "adv": adv,
        "rollout": rollout,
        "factor": factor,
    }


@given(batches(), st.sampled_from(MODES))
@settings(max_examples=60, deadline=None)
def test_weights_sum_to_one(batch: dict[str, torch.Tensor], mode: str) -> None:
    w = aggregation_weights(batch["mask"], mode, batch["rollout"])
    expected = 1.0 if batch["mask"].any() else 0.0
    assert w.sum().item() == pytest.approx(expected, abs=1e-5)
    assert (w[~batch["mask"]] == 0).all()


@given(batches(), st.sampled_from(MODES), st.data())
@settings(max_examples=60, deadline=None)
def test_minibatch_losses_sum_to_full_batch_loss(
    batch: dict[str, torch.Tensor], mode: str, data: st.DataObject
) -> None:
    b = batch["mask"].shape[0]
    w = aggregation_weights(batch["mask"], mode, batch["rollout"])
    kwargs = {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.05}

    def loss_of(rows: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        loss, _ = ppo_clip_loss(
            logp[rows],
            batch["old"][rows],
            batch["adv"][rows],
            batch["mask"][rows],
            w[rows],
            clip_factor_B=batch["factor"][rows],
            ref_logp_B_T=batch["ref"][rows],
            **kwargs,
        )
        return loss

    full_logp = batch["new"].clone().requires_grad_(True)
    full = loss_of(torch.arange(b), full_logp)
    full.backward()

    order = torch.tensor(data.draw(st.permutations(list(range(b)))))
    cuts = sorted(data.draw(st.sets(st.integers(1, max(b - 1, 1)), max_size=3)))
    split_logp = batch["new"].clone().requires_grad_(True)
    total = torch.zeros(())
    for chunk in torch.tensor_split(order, [c for c in cuts if c < b]):
        if len(chunk):
            part = loss_of(chunk, split_logp)
            part.backward()
            total = total + part.detach()
    assert total.item() == pytest.approx(full.item(), abs=1e-5)
    assert torch.allclose(split_logp.grad, full_logp.grad, atol=1e-6)
