"""Per-turn off-policy correction (#37): each turn's tokens are weighted against that
turn's own behaviour log-probs, whatever weight version sampled it; ``tis_mode``
truncates or masks. Exact numbers on a hand-built batch of two versions, and the
statistic a real update reports."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from builders import GradientRecorder
from test_ppo import ONE_STEP, policy, sampled_batch
from turnrl.records import parse_record
from turnrl.table import TurnTable
from turnrl.train.update.ppo import build_update_batch, ppo_update
from turnrl.train.update.turn_correction import turn_is_weights


def two_version_batch():
    """One rollout of two turns: turn 0 sampled by version 0, turn 1 by version 1."""
    turns = [
        {"turn": 0, "policy_version": 0, "response_ids": [5, 6], "logprobs": [-1.5, -1.0]},
        {"turn": 1, "policy_version": 1, "response_ids": [7], "logprobs": [-0.2], "reward": 1.0},
    ]
    records = [
        parse_record({"task_id": "t", "traj_id": "r0", "prompt_ids": [1, 2], **turn})
        for turn in turns
    ]
    table = TurnTable.from_records(records)
    return build_update_batch(table.records, table, np.ones(2), None, "token-mean")


LEARNER = torch.tensor([[-1.0, -2.0], [-0.9, 0.0]])
"""The learner's log-probs of the same tokens now (version 2), padding at [1, 1]."""


def test_each_turn_is_truncated_against_its_own_behaviour_log_probs() -> None:
    batch = two_version_batch()
    torch.testing.assert_close(batch.old_logp_B_T, torch.tensor([[-1.5, -1.0], [-0.2, 0.0]]))
    weights, stats = turn_is_weights(LEARNER, batch.old_logp_B_T, batch.mask_B_T, 1.5)
    # turn 0 (version 0): exp(0.5) = 1.649 capped at 1.5, exp(-1) = 0.368;
    # turn 1 (version 1): exp(-0.9 + 0.2) = exp(-0.7) = 0.497; padding 0
    expected = torch.tensor([[1.5, math.exp(-1.0)], [math.exp(-0.7), 0.0]])
    torch.testing.assert_close(weights, expected)
    assert stats == {"tis_corrected_frac": pytest.approx(1 / 3)}


def test_mask_mode_drops_tokens_outside_the_band() -> None:
    batch = two_version_batch()
    weights, stats = turn_is_weights(LEARNER, batch.old_logp_B_T, batch.mask_B_T, 2.0, "mask")
    # band [1/2, 2]: exp(0.5) kept; exp(-1) and exp(-0.7) = 0.497 fall below 1/2
    expected = torch.tensor([[math.exp(0.5), 0.0], [0.0, 0.0]])
    torch.testing.assert_close(weights, expected)
    assert stats == {"tis_corrected_frac": pytest.approx(2 / 3)}
    with pytest.raises(ValueError, match="unknown tis_mode"):
        turn_is_weights(LEARNER, batch.old_logp_B_T, batch.mask_B_T, 2.0, "clip")  # type: ignore[arg-type]


def test_an_update_masks_the_stale_turns_only() -> None:
    """Rows 0-2 as if sampled by an older version (behaviour log-probs 1.0 above the
    learner's: ratio exp(-1) < 1/2, masked), rows 3-5 by the current one (ratio 1)."""
    model = policy()
    batch = sampled_batch(model, temperature=1.0)
    stale = torch.zeros_like(batch.mask_B_T)
    stale[:3] = batch.mask_B_T[:3]
    shifted = replace(batch, old_logp_B_T=batch.old_logp_B_T + stale)
    config = replace(ONE_STEP, tis_cap=2.0, tis_mode="mask")
    stats = ppo_update(
        model, GradientRecorder(model.parameters()), shifted, config,
        temperature=1.0, reference=None, seed=0,
    )  # fmt: skip
    tokens = float(batch.mask_B_T.sum())
    fresh = float(batch.mask_B_T[3:].sum())
    assert stats["tis_corrected_frac"] == pytest.approx(float(stale.sum()) / tokens)
    assert stats["is_weight_mean"] == pytest.approx(fresh / tokens, abs=1e-5)
    truncate = ppo_update(
        model, GradientRecorder(model.parameters()), shifted, replace(config, tis_mode="truncate"),
        temperature=1.0, reference=None, seed=0,
    )  # fmt: skip
    assert truncate["tis_corrected_frac"] == 0.0  # exp(-1) is below the cap: not changed
    expected = (float(stale.sum()) * math.exp(-1.0) + fresh) / tokens
    assert truncate["is_weight_mean"] == pytest.approx(expected, abs=1e-5)
