"""``ppo_update``: each ingredient of the update changes what it must.

Each test fails when its ingredient is dropped (checked by planting the bug):
recomputing log-probs at temperature 1 instead of the sampling temperature, the
A2TGPO clip factor, the mini-batch rescaling of the aggregation weights, the KL
reference; and ``max_grad_norm = 0`` means no clipping.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from builders import GradientRecorder, one_turn_records
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.table import TurnTable
from turnrl.train.update.ppo import PPOConfig, UpdateBatch, build_update_batch, ppo_update

ROWS = 6


def policy() -> HFPolicy:
    return build_tiny_policy(seed=0, hidden=16, layers=1)


def sampled_batch(
    model: HFPolicy,
    temperature: float,
    advantages: np.ndarray | None = None,
    clip_factor: np.ndarray | None = None,
) -> UpdateBatch:
    """``ROWS`` one-turn rows sampled from ``model`` at ``temperature`` (behaviour
    log-probs as sampled), one rollout (and one task) each."""
    contexts = [model.encode_initial([{"role": "user", "content": f"q{i}"}]) for i in range(ROWS)]
    samples = model.sample(contexts, max_new_tokens=5, temperature=temperature, seed=0)
    records = one_turn_records(contexts, samples, [f"t{i}" for i in range(ROWS)])
    table = TurnTable.from_records(records)
    adv = np.linspace(-1.0, 1.0, ROWS) if advantages is None else advantages
    return build_update_batch(table.records, table, adv, clip_factor, "token-mean")


def weights(model: HFPolicy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


ONE_STEP = PPOConfig(lr=1e-2, epochs=1, minibatch_size=ROWS, max_grad_norm=0.0)


def test_log_probs_are_recomputed_at_the_sampling_temperature() -> None:
    model = policy()
    with torch.no_grad():  # a random model is near uniform, where temperature barely matters
        model.model.lm_head.weight.mul_(5.0)
    batch = sampled_batch(model, temperature=0.7)
    optimizer = GradientRecorder(model.parameters())
    stats = ppo_update(model, optimizer, batch, ONE_STEP, temperature=0.7, reference=None, seed=0)
    # The first (here: only) mini-batch is on-policy: ratio 1, no KL to the behaviour policy.
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert abs(stats["approx_kl_old"]) < 1e-7
    # The same rows scored at temperature 1 are far from it (what the check guards against).
    wrong = ppo_update(model, optimizer, batch, ONE_STEP, temperature=1.0, reference=None, seed=0)
    assert abs(wrong["ratio_mean"] - 1.0) > 5e-3 and wrong["approx_kl_old"] > 1e-2


def test_clip_factor_narrows_the_clip_range_per_row() -> None:
    model = policy()
    # Rows 0-2 get a quarter of the clip range, rows 3-5 the full range.
    factor = np.array([0.25, 0.25, 0.25, 1.0, 1.0, 1.0])
    batch = sampled_batch(model, 1.0, advantages=np.ones(ROWS), clip_factor=factor)
    # Behaviour log-probs 0.1 below the current ones: every ratio is e^0.1 = 1.105, above
    # 1 + 0.2 * 0.25 = 1.05 (clipped, no gradient) but below 1 + 0.2 (not clipped).
    batch.old_logp_B_T = batch.old_logp_B_T - 0.1 * batch.mask_B_T
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    stats = ppo_update(model, optimizer, batch, ONE_STEP, temperature=1.0, reference=None, seed=0)
    lengths = batch.mask_B_T.sum(dim=1)
    narrowed = float(lengths[:3].sum() / lengths.sum())
    assert stats["clip_frac"] == pytest.approx(narrowed, abs=1e-6)
    assert stats["clip_frac_high"] == pytest.approx(narrowed, abs=1e-6)
    assert stats["ratio_mean"] == pytest.approx(np.exp(0.1), abs=1e-4)
    # All rows narrowed: nothing to learn from, the weights stay exactly as they are.
    clipped = replace(batch, clip_factor_B=torch.full((ROWS,), 0.25))
    before = weights(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    stats = ppo_update(model, optimizer, clipped, ONE_STEP, temperature=1.0, reference=None, seed=0)
    assert stats["clip_frac"] == 1.0 and same(before, weights(model))
    # Without the factor the same batch is inside the clip range and moves the weights.
    unclipped = replace(batch, clip_factor_B=None)
    stats = ppo_update(
        model, optimizer, unclipped, ONE_STEP, temperature=1.0, reference=None, seed=0
    )
    assert stats["clip_frac"] == 0.0 and not same(before, weights(model))


@pytest.mark.parametrize("update", ["rows", "tree"])
def test_split_batch_gradient_equals_the_full_batch_gradient(update: str) -> None:
    model = policy()
    batch = sampled_batch(model, 1.0)
    full = GradientRecorder(model.parameters())
    one_step = replace(ONE_STEP, update=update)
    ppo_update(model, full, batch, one_step, temperature=1.0, reference=None, seed=0)
    split = GradientRecorder(model.parameters())
    config = replace(one_step, minibatch_size=2)  # 3 mini-batches of 2 rows (tasks)
    ppo_update(model, split, batch, config, temperature=1.0, reference=None, seed=0)
    assert len(full.steps) == 1 and len(split.steps) == 3
    # Each mini-batch step sees the full-batch objective's scale: the mean of the three
    # steps' gradients is the one full-batch gradient (not a third of it).
    for whole, *parts in zip(full.steps[0], *split.steps, strict=True):
        mean = torch.stack(parts).mean(dim=0)
        torch.testing.assert_close(mean, whole, rtol=1e-4, atol=1e-6)
    assert float(torch.linalg.vector_norm(full.steps[0][0])) > 0


def test_kl_penalty_pulls_towards_the_reference() -> None:
    model = policy()
    reference = model.clone_frozen()
    with torch.no_grad():  # move the policy away from its reference
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    batch = sampled_batch(model, 1.0, advantages=np.zeros(ROWS))  # no policy gradient
    start = weights(model)
    kl = replace(ONE_STEP, kl_coef=0.5, lr=0.05)
    optimizer = torch.optim.SGD(model.parameters(), lr=kl.lr)
    first = ppo_update(model, optimizer, batch, kl, temperature=1.0, reference=reference, seed=0)
    assert first["kl_ref"] > 1e-4
    assert first["kl_loss"] == pytest.approx(0.5 * first["kl_ref"], rel=1e-4)
    assert not same(start, weights(model))
    second = ppo_update(model, optimizer, batch, kl, temperature=1.0, reference=reference, seed=0)
    assert second["kl_ref"] < first["kl_ref"]  # the step went towards the reference
    # kl_coef = 0: zero advantages and no penalty leave the weights alone.
    moved = weights(model)
    no_kl = replace(kl, kl_coef=0.0)
    ppo_update(model, optimizer, batch, no_kl, temperature=1.0, reference=reference, seed=0)
    assert same(moved, weights(model))


def test_max_grad_norm_zero_means_no_clipping() -> None:
    model = policy()
    batch = sampled_batch(model, 1.0)
    free = GradientRecorder(model.parameters())
    stats = ppo_update(model, free, batch, ONE_STEP, temperature=1.0, reference=None, seed=0)
    huge = GradientRecorder(model.parameters())
    config = replace(ONE_STEP, max_grad_norm=1e9)
    ppo_update(model, huge, batch, config, temperature=1.0, reference=None, seed=0)
    assert stats["grad_norm"] > 0
    for a, b in zip(free.steps[0], huge.steps[0], strict=True):
        torch.testing.assert_close(a, b)
    # A small threshold does clip: the recorded gradient has that norm.
    clipped = GradientRecorder(model.parameters())
    small = replace(ONE_STEP, max_grad_norm=stats["grad_norm"] / 4)
    ppo_update(model, clipped, batch, small, temperature=1.0, reference=None, seed=0)
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in clipped.steps[0]]))
    assert float(norm) == pytest.approx(stats["grad_norm"] / 4, rel=1e-4)


def test_update_batch_leaves_out_copies_and_empty_responses() -> None:
    def row(traj: str, turn: int, response: list[int], **extra) -> dict:
        return {
            "task_id": "t",
            "traj_id": traj,
            "turn": turn,
            "prompt_ids": [1, turn],
            "response_ids": response,
            "logprobs": [-0.5] * len(response),
            **extra,
        }

    records = [
        row("a", 0, [5, 6]),
        row("b", 0, [5, 6], copy_of="a", train=False),  # a tree's shared turn
        row("a", 1, [7]),
        row("b", 1, []),  # nothing sampled
    ]
    table = TurnTable.from_records(records)
    typed = table.records  # the records as the table checked them (TurnRecord)
    batch = build_update_batch(typed, table, np.array([1.0, 2.0, 3.0, 4.0]), None, "token-mean")
    assert batch.responses == [[5, 6], [7]]
    assert batch.contexts == [[1, 0], [1, 1]]
    assert batch.adv_B.tolist() == [1.0, 3.0]
    torch.testing.assert_close(batch.weight_B_T, torch.tensor([[1 / 3, 1 / 3], [1 / 3, 0.0]]))
    with pytest.raises(ValueError, match="no record to update on"):
        build_update_batch(typed[1:2] + typed[3:], table, np.zeros(2), None, "token-mean")
