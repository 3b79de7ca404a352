"""``train.aggregation = "legacy-verl"``: the Agent Lightning v0.x + verl update's per-token
weights in the trainer's loss (:mod:`turnrl.train.update.legacy_pipeline`, which the grouping
study's ``examples/grouping/legacy.py`` re-exports): exact weights on hand-built batches,
invariants on generated ones."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from test_agent_loop import agent_config
from turnrl.policy import HFPolicy
from turnrl.table import TurnTable
from turnrl.train.agent.loop import AgentTrainer
from turnrl.train.config import RunConfig, TrainConfig, load_config
from turnrl.train.update.legacy_pipeline import (
    LegacyPipeline,
    legacy_aggregation_weights,
    pipeline_of,
)
from turnrl.train.update.ppo import build_update_batch
from turnrl.types import TurnRecord


def record(task: str, traj: str, turn: int, prompt: int, response: int) -> TurnRecord:
    return TurnRecord(
        task_id=task,
        traj_id=traj,
        turn=turn,
        prompt_ids=tuple(range(1, prompt + 1)),
        response_ids=tuple(range(1, response + 1)),
        logprobs=tuple([-1.0] * response),
        reward=1.0 if traj.endswith("a") else 0.0,
        done=True,
    )


# task t1: rollout a (2 turns), rollout b (1 turn); task t2: rollout c (2 turns), d (1 turn)
RECORDS = [
    record("t1", "t1a", 0, 3, 2),
    record("t1", "t1a", 1, 12, 1),
    record("t1", "t1b", 0, 3, 3),
    record("t2", "t2c", 0, 4, 2),
    record("t2", "t2c", 1, 11, 2),
    record("t2", "t2d", 0, 4, 1),
]


def test_hand_built_batch_drops_long_prompts_and_weighs_micro_batch_token_means() -> None:
    # prompts 3, 12, 3, 4, 11, 4 with a limit of 10: rows 1 and 4 dropped; 4 rows left,
    # a multiple of ppo_mini_batch_size 2; actor mini-batch 2 * 2 = 4 rows (one step),
    # micro-batches of 2 rows: accumulation 2; a token of micro m weighs 1 / (tokens(m) * 2)
    pipeline = LegacyPipeline(
        ppo_mini_batch_size=2, rollout_n=2, micro_batch_size=2, max_prompt_length=10
    )
    table = TurnTable.from_records(RECORDS, source="hand")
    batch = build_update_batch(
        RECORDS, table, np.zeros(6), None, "legacy-verl", legacy=pipeline, legacy_seed=3
    )
    order = [0, 2, 3, 5]
    random.Random(3).shuffle(order)  # the pipeline's shuffle of the kept rows
    assert order == [5, 0, 3, 2]
    # micro-batches [5, 0] (1 + 2 tokens): 1 / (3 * 2); [3, 2] (2 + 3 tokens): 1 / (5 * 2)
    expected = torch.zeros(6, 3)
    for row, tokens, weight in ((5, 1, 1 / 6), (0, 2, 1 / 6), (3, 2, 1 / 10), (2, 3, 1 / 10)):
        expected[row, :tokens] = weight
    torch.testing.assert_close(batch.weight_B_T, expected)
    assert float(batch.weight_B_T.sum()) == pytest.approx(1.0)


def test_a_short_last_step_keeps_the_full_accumulation_count() -> None:
    # no drop; 6 rows, ppo_mini_batch_size 1, n 4: steps of 4 rows, micro 2, accumulation 2;
    # the second step holds 2 rows (one micro-batch): it weighs half a step
    pipeline = LegacyPipeline(ppo_mini_batch_size=1, rollout_n=4, micro_batch_size=2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    weights = legacy_aggregation_weights(mask, [1] * 6, pipeline, seed=0)
    order = list(range(6))
    random.Random(0).shuffle(order)
    first, last = order[:4], order[4:]
    # each micro-batch sums to 1 / (accumulation 2 * steps 2): two in the first step
    assert float(weights[first].sum()) == pytest.approx(1 / 2)
    assert float(weights[last].sum()) == pytest.approx(1 / 4)


def test_the_remainder_cut_drops_rows_at_random() -> None:
    pipeline = LegacyPipeline(ppo_mini_batch_size=4, rollout_n=1, micro_batch_size=4)
    mask = torch.ones(6, 1)
    weights = legacy_aggregation_weights(mask, [1] * 6, pipeline, seed=5)
    kept = (weights.squeeze(1) > 0).nonzero().flatten().tolist()
    order = list(range(6))
    random.Random(5).shuffle(order)
    assert kept == sorted(order[:4])
    torch.testing.assert_close(weights[kept], torch.full((4, 1), 0.25))


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 5), min_size=1, max_size=24),
    prompts=st.data(),
    mini=st.integers(1, 4),
    n=st.integers(1, 4),
    micro=st.integers(1, 4),
    limit=st.one_of(st.none(), st.integers(1, 30)),
    seed=st.integers(0, 1000),
)
def test_weights_are_bounded_per_micro_batch_and_zero_where_dropped(
    lengths: list[int], prompts, mini: int, n: int, micro: int, limit, seed: int
) -> None:
    if micro > mini * n:  # legacy.py divides by mini * n // micro: verl's configs never do this
        micro = mini * n
    width = max(max(lengths), 1)
    mask = torch.tensor([[1.0] * k + [0.0] * (width - k) for k in lengths])
    prompt = prompts.draw(
        st.lists(st.integers(1, 30), min_size=len(lengths), max_size=len(lengths))
    )
    pipeline = LegacyPipeline(mini, n, micro, limit)
    weights = legacy_aggregation_weights(mask, prompt, pipeline, seed)
    # every micro-batch with tokens sums to 1 / (accumulation * steps): verl's integer
    # accumulation count makes a step sum above 1 when micro does not divide it
    kept = int((weights.sum(dim=1) > 0).sum())
    rows = sum(1 for p in prompt if limit is None or p <= limit) // mini * mini
    steps = -(-rows // (mini * n)) if rows else 1
    micros = sum(-(-min(mini * n, rows - s) // micro) for s in range(0, rows, mini * n))
    bound = micros / (pipeline.accumulation * steps)
    assert float(weights.sum()) <= bound + 1e-5 and kept <= rows
    assert bool((weights[mask == 0] == 0).all())
    if limit is not None:
        long_rows = [i for i, p in enumerate(prompt) if p > limit]
        assert float(weights[long_rows].sum()) == 0.0


def test_the_trainer_option_is_read_from_config_and_refused_without_its_knobs(
    tmp_path: Path,
) -> None:
    assert pipeline_of(TrainConfig(), 8, 4) is None  # token-mean: no pipeline
    train = TrainConfig(aggregation="legacy-verl", legacy_micro_batch=2)
    assert pipeline_of(train, 8, 4) == LegacyPipeline(8, 4, 2, None)
    train = TrainConfig(aggregation="legacy-verl", legacy_mini_batch=3, legacy_max_prompt_length=9)
    assert pipeline_of(train, 8, 4) == LegacyPipeline(3, 4, 4, 9)
    path = tmp_path / "run.toml"
    path.write_text('[train]\naggregation = "legacy-verl"\nlegacy_max_prompt_length = 100\n')
    config = load_config(RunConfig, path)
    assert (config.train.aggregation, config.train.legacy_max_prompt_length) == ("legacy-verl", 100)
    table = TurnTable.from_records(RECORDS, source="hand")
    with pytest.raises(ValueError, match="legacy-verl"):
        build_update_batch(RECORDS, table, np.zeros(6), None, "legacy-verl")


def test_an_agent_run_trains_with_the_pipeline_weights(tmp_path: Path) -> None:
    """The agent loop's update takes the pipeline's weights: a 2-step run with
    ``legacy-verl`` changes the weights, and the rows it drops get none."""
    config = agent_config(
        tmp_path,
        "train.lr=0.05",
        "train.aggregation=legacy-verl",
        "credit.estimator=grpo_mixed",
        'credit.params={lone = "raw"}',
        agent="two_calls_graded",
    )
    assert pipeline_of(config.train, 2, 2) == LegacyPipeline(2, 2, 4, None)
    run = AgentTrainer(config, quiet=True).run()
    checkpoint = torch.load(run / "checkpoints" / "step-000002.pt", weights_only=False)
    warm = HFPolicy.from_pretrained(run / "warm_start").state_dict()
    changed = [not torch.equal(warm[k], v) for k, v in checkpoint["model"].items()]
    assert any(changed)
