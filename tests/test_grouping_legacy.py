"""The Agent Lightning v0.x + verl update model of the grouping experiment
(``examples/grouping/legacy.py``): row drops and per-micro-batch token-mean weights."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest
import torch

PATH = Path(__file__).resolve().parents[1] / "examples" / "grouping" / "legacy.py"
_spec = importlib.util.spec_from_file_location("grouping_legacy", PATH)
assert _spec is not None and _spec.loader is not None
legacy = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = legacy  # dataclasses look their module up there
_spec.loader.exec_module(legacy)


def test_long_prompts_then_a_random_remainder_are_dropped() -> None:
    pipeline = legacy.LegacyPipeline(ppo_mini_batch_size=2, rollout_n=4, max_prompt_length=10)
    lengths = [5, 12, 7, 3, 15, 8, 9]
    picked = legacy.select_rows(lengths, pipeline, random.Random(0))
    assert (picked.dropped_long, picked.dropped_remainder) == (2, 1)
    assert len(picked.rows) == 4 and set(picked.rows) < {0, 2, 3, 5, 6}
    again = legacy.select_rows(lengths, pipeline, random.Random(0))
    assert again == picked  # the shuffle is the rng's
    keep_all = legacy.LegacyPipeline(ppo_mini_batch_size=1, rollout_n=4)
    assert sorted(legacy.select_rows(lengths, keep_all, random.Random(1)).rows) == list(range(7))


def test_weights_are_a_token_mean_per_micro_batch_over_the_accumulation_count() -> None:
    # actor mini-batch 1 * 4 = 4 rows, micro-batches of 2 rows: accumulation 2.
    # 6 rows -> 2 optimiser steps: [0..3] (micro [0,1], [2,3]) and [4,5] (one micro).
    pipeline = legacy.LegacyPipeline(ppo_mini_batch_size=1, rollout_n=4, micro_batch_size=2)
    assert (pipeline.actor_mini_batch, pipeline.accumulation) == (4, 2)
    lengths = [1, 3, 2, 2, 4, 1]
    mask = torch.tensor([[1.0] * n + [0.0] * (4 - n) for n in lengths])
    weights = legacy.legacy_weights(mask, pipeline)
    # micro 0 and 1 hold 4 tokens each: 1 / (4 * 2 * 2); micro 2 holds 5: 1 / (5 * 2 * 2)
    per_token = [1 / 16, 1 / 16, 1 / 16, 1 / 16, 1 / 20, 1 / 20]
    torch.testing.assert_close(weights, mask * torch.tensor(per_token)[:, None])
    # the short last step is still divided by the full accumulation count: it weighs half
    assert float(weights[:4].sum()) == pytest.approx(0.5) and float(weights[4:].sum()) == (
        pytest.approx(0.25)
    )


def test_micro_batches_restart_at_every_mini_batch() -> None:
    # actor mini-batch 3 rows, micro-batches of 2: [0,1], [2] | [3,4], [5];
    # accumulation 3 // 2 = 1 (verl's integer division), 2 steps: 1 / (tokens * 1 * 2)
    pipeline = legacy.LegacyPipeline(ppo_mini_batch_size=3, rollout_n=1, micro_batch_size=2)
    assert pipeline.accumulation == 1
    mask = torch.ones(6, 1)
    weights = legacy.legacy_weights(mask, pipeline).squeeze(1)
    torch.testing.assert_close(weights, torch.tensor([1, 1, 2, 1, 1, 2]) / 4.0)


def test_weights_equal_verls_token_mean_loss_with_gradient_accumulation() -> None:
    """Against verl's own ``agg_loss`` (token-mean within a micro-batch)."""
    pytest.importorskip("verl", reason="verl is not installed (see requirements/integrations.txt)")
    from verl.trainer.ppo.core_algos import agg_loss

    pipeline = legacy.LegacyPipeline(ppo_mini_batch_size=2, rollout_n=3, micro_batch_size=4)
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 6, (11,), generator=generator)
    mask = (torch.arange(6)[None, :] < lengths[:, None]).float()
    loss_mat = torch.randn(11, 6, generator=generator)
    steps = []
    for s in range(0, 11, pipeline.actor_mini_batch):
        step = 0.0
        for m in range(s, min(s + pipeline.actor_mini_batch, 11), pipeline.micro_batch_size):
            end = min(m + pipeline.micro_batch_size, s + pipeline.actor_mini_batch, 11)
            micro = agg_loss(loss_mat[m:end], mask[m:end], "token-mean")
            step += float(micro) / pipeline.accumulation
        steps.append(step)
    weights = legacy.legacy_weights(mask, pipeline)
    assert float((weights * loss_mat).sum()) == pytest.approx(sum(steps) / len(steps), rel=1e-5)
