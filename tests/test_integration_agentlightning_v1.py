"""Agent Lightning 1.0 rollouts -> turn records, and 1.0's rollout-level advantage on one batch.

Runs in ``.venv-integrations`` (agentlightning 1.0.2 beside verl 0.9.1:
requirements/integrations-nodeps.txt says why its Python requirement is lifted);
the tests of plain JSON dumps and of the version guards need only turnrl and run
everywhere, the rest are skipped where agentlightning 1.x is not installed.

The batch (2 questions x 2 rollouts, 1-3 LLM calls each): question ``q1`` has a
3-call rollout that succeeds (reward 1) and a 1-call rollout that fails (0);
``q2`` has two 2-call rollouts, one succeeding. Every rollout of a question starts
from the same prompt; later calls see the rollout's own earlier responses.
"""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path

import numpy as np
import pytest

import turnrl.integrations.agentlightning as agl03
from turnrl.credit import compute_advantages
from turnrl.errors import CapabilityError, TurnRecordError
from turnrl.integrations.agentlightning import read_rollouts_jsonl, rollout_to_records
from turnrl.integrations.agentlightning_v1 import (
    completed_rollout_to_records,
    completed_rollouts_to_records,
    triplet_events_to_records,
)
from turnrl.table import TurnTable, default_node_id

ROOT = Path(__file__).resolve().parents[1]

# (rollout id, data id, sample index in step, number of calls, final reward)
BATCH = [
    ("r1a", "q1", 0, 3, 1.0),
    ("r1b", "q1", 0, 1, 0.0),
    ("r2a", "q2", 1, 2, 1.0),
    ("r2b", "q2", 1, 2, 0.0),
]
QUESTION_TOKEN = {"q1": 5, "q2": 6}


def rollout_dump(rollout_id: str, data_id: str, sample: int, calls: int, reward: float) -> dict:
    """A ``CompletedRollout.model_dump()``-shaped rollout: call k answers [10 + k, r] where
    r is the rollout's own token, then sees an observation token 30 + k."""
    own = 40 + [b[0] for b in BATCH].index(rollout_id)
    context = [1, QUESTION_TOKEN[data_id]]
    triplets = []
    for k in range(calls):
        response = [10 + k, own]
        triplets.append(
            {
                "prompt": {"token_ids": list(context)},
                "response": {"token_ids": response, "log_probs": [-0.5, -0.25]},
                "reward": reward if k == calls - 1 else None,
                "metadata": {"server": {"model": "m", "version": 0}},
            }
        )
        context = context + response + [30 + k]
    return {
        "rollout_id": rollout_id,
        "data_id": data_id,
        "step": 0,
        "sample_idx_in_step": sample,
        "enqueue_time": 0.0,
        "final_reward": reward,
        "triplets": triplets,
        "metadata": {"batch_idx": 0, "sample_idx_in_batch": sample},
    }


DUMPS = [rollout_dump(*row) for row in BATCH]


def test_completed_rollout_dump_to_records_fields() -> None:
    records = completed_rollout_to_records(DUMPS[0])
    assert [(r.task_id, r.traj_id, r.turn, r.role, r.reward, r.done) for r in records] == [
        ("q1", "r1a", 0, "agent", 0.0, False),
        ("q1", "r1a", 1, "agent", 0.0, False),
        ("q1", "r1a", 2, "agent", 1.0, True),
    ]
    assert [r.prompt_ids for r in records] == [
        (1, 5),
        (1, 5, 10, 40, 30),
        (1, 5, 10, 40, 30, 11, 40, 31),
    ]
    assert [r.response_ids for r in records] == [(10, 40), (11, 40), (12, 40)]
    assert records[0].logprobs == (-0.5, -0.25)
    assert [(r.agl.reward, r.agl.final_reward) for r in records] == [
        (None, 1.0),
        (None, 1.0),
        (1.0, 1.0),
    ]
    assert records[0].agl.metadata == {"batch_idx": 0, "sample_idx_in_batch": 0}
    table = TurnTable.from_records(records)
    assert table.node_names[table.node_code[0]] == default_node_id("q1", [1, 5], None)


def test_rewards_fillna_and_skipped_empty_rollouts() -> None:
    unrewarded = {
        **DUMPS[1],
        "final_reward": None,
        "triplets": [{**DUMPS[1]["triplets"][0], "reward": None}],
    }
    with pytest.raises(TurnRecordError, match="final_reward"):
        completed_rollout_to_records(unrewarded)
    assert [r.reward for r in completed_rollout_to_records(unrewarded, fillna=0.25)] == [0.25]
    empty = {**DUMPS[1], "rollout_id": "failed", "triplets": []}
    records = completed_rollouts_to_records([empty, DUMPS[2]], task_id="x")
    assert [(r.task_id, r.traj_id, r.turn) for r in records] == [("x", "r2a", 0), ("x", "r2a", 1)]


def test_each_version_refuses_the_others_rollouts(monkeypatch) -> None:
    legacy = read_rollouts_jsonl(ROOT / "examples" / "agentlightning" / "rollouts.jsonl")[0]
    with pytest.raises(
        TurnRecordError, match=r"0.3 RolloutLegacy goes through.*rollout_to_records"
    ):
        completed_rollout_to_records(legacy)
    with pytest.raises(TurnRecordError, match=r"1.0 rollout.*agentlightning_v1"):
        rollout_to_records(DUMPS[0])
    store_rollout = {"rollout_id": "r", "input": {}, "config": {}, "status": {"state": "queuing"}}
    with pytest.raises(TurnRecordError, match=r"1.0 store Rollout.*CompletedRollout"):
        completed_rollout_to_records(store_rollout)
    monkeypatch.setattr(agl03, "AGENTLIGHTNING_VERSION", "1.0.2")
    with pytest.raises(CapabilityError, match=r"needs agentlightning 0.x, but 1.0.2 .*_v1"):
        agl03.records_to_rollout(completed_rollout_to_records(DUMPS[1]))
    monkeypatch.setattr(agl03, "AGENTLIGHTNING_VERSION", None)
    with pytest.raises(CapabilityError, match="not"):
        agl03.spans_to_records([], rollout_id="r", task_id="q")


# --- against the real agentlightning 1.0 ---------------------------------------------

os.environ.setdefault("WANDB_MODE", "disabled")


@pytest.fixture(scope="module")
def v1():
    return pytest.importorskip(
        "agentlightning.verl.rollout_level_advantage",
        reason="needs agentlightning 1.x (.venv-integrations)",
    )


def completed_rollouts():
    from agentlightning.verl.agl_rollout_manager import CompletedRollout

    return [CompletedRollout.model_validate(d) for d in DUMPS]


def test_real_completed_rollouts_convert_as_their_dumps(v1) -> None:
    from agentlightning.verl.agl_rollout_manager import CompletedRollout, Triplet

    rollouts = completed_rollouts()
    assert isinstance(rollouts[0].triplets[0], Triplet)
    assert completed_rollouts_to_records(rollouts) == completed_rollouts_to_records(DUMPS)
    dumped = [r.model_dump(mode="json") for r in rollouts]
    assert completed_rollouts_to_records(dumped) == completed_rollouts_to_records(rollouts)
    with pytest.raises(TurnRecordError, match="agentlightning_v1"):
        rollout_to_records(CompletedRollout.model_validate(DUMPS[0]))


def triplet_events(event_class=dict) -> list:
    """r1a's calls as the store returns them with ?format=triplet, plus a failed call, a
    call without response tokens and two reward events (the last one counts)."""

    def event(kind: str, data: dict):
        fields = {"event_type": kind, "rollout_id": "r1a", "attempt_id": "0"}
        return event_class(**fields, timestamp=0.0, data=data)

    calls = [
        {
            "prompt_token_ids": t["prompt"]["token_ids"],
            "response_token_ids": t["response"]["token_ids"],
            "response_log_probs": t["response"]["log_probs"],
            "server": {"model": "m", "version": 0},
        }
        for t in DUMPS[0]["triplets"]
    ]
    failed = {**calls[1], "http_status": 500, "status": "error"}
    empty = {**calls[2], "response_token_ids": []}
    return [
        event("model_request", calls[0]),
        event("model_request", failed),
        event("model_request", calls[1]),
        event("reward", {"value": 0.5}),
        event("model_request", empty),
        event("model_request", calls[2]),
        event("custom", {"note": "passed through"}),
        event("reward", {"value": 1.0, "source": "agent"}),
    ]


def test_triplet_events_to_records() -> None:
    records = triplet_events_to_records(triplet_events(), rollout_id="r1a", task_id="q1")
    assert records == completed_rollout_to_records({**DUMPS[0], "metadata": None})
    raw = {"event_type": "model_request", "data": {"response": {"choices": []}}}
    with pytest.raises(TurnRecordError, match=r"r1a'?:1: field 'data.response_token_ids'"):
        triplet_events_to_records([raw], rollout_id="r1a", task_id="q1")


def test_triplet_events_follow_agent_lightnings_rollout_manager(v1) -> None:
    """Agent Lightning's own _build_completed_rollout (its HTTP fetch replaced by the
    events) and triplet_events_to_records give the same records."""
    from types import SimpleNamespace

    from agentlightning.schemas import Event, Rollout
    from agentlightning.verl.agl_rollout_manager import AglRolloutManagerBase, EnqueuedRollout

    events = triplet_events(Event)
    manager = SimpleNamespace(_fetch_rollout_events=lambda rollout_id: ([], events))
    enqueued = EnqueuedRollout(
        data_id="q1", rollout_id="r1a", step=0, sample_idx_in_step=0, enqueue_time=0.0
    )
    stored = Rollout.model_validate(
        {
            "rollout_id": "r1a",
            "input": {},
            "config": {},
            "status": {"created_at": 0, "updated_at": 0},
        }
    )
    completed = AglRolloutManagerBase._build_completed_rollout(manager, enqueued, stored)
    assert len(completed.triplets) == 3
    ours = triplet_events_to_records(events, rollout_id="r1a", task_id="q1")
    theirs = completed_rollout_to_records(completed)
    assert [(r.prompt_ids, r.response_ids, r.logprobs, r.reward) for r in ours] == [
        (r.prompt_ids, r.response_ids, r.logprobs, r.reward) for r in theirs
    ]
    assert ours == completed_rollout_to_records({**DUMPS[0], "metadata": None})


def training_batch(level: str):
    """1.0's own RolloutAdapter on the batch, prepared as its trainer does before the
    advantage step (uid = data id, response mask, rewards = scores). Its scores are
    bfloat16; cast to float32 so the comparison holds to 1e-6, not to bf16's 3 digits."""
    import torch
    from agentlightning.verl.rollout_adapter import RolloutAdapter
    from verl.trainer.ppo.ray_trainer import compute_response_mask

    adapter = RolloutAdapter(
        max_prompt_length=16,
        max_response_length=16,
        device=torch.device("cpu"),
        pad_token_id=0,
        trace_aggregator_level=level,
    )
    batch, _ = adapter.get_train_data_batch(completed_rollouts())
    batch.non_tensor_batch["uid"] = batch.non_tensor_batch["data_id_list"]
    if "response_mask" not in batch.batch:
        batch.batch["response_mask"] = compute_response_mask(batch)
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"].float()
    return batch


def row_advantages(batch) -> np.ndarray:
    """The one advantage of each row (checked constant over the row's trained tokens)."""
    mask = batch.batch["response_mask"].bool()
    out = []
    for row in range(len(batch)):
        values = batch.batch["advantages"][row][mask[row]]
        assert bool((values == values[0]).all())
        out.append(float(values[0]))
    return np.array(out)


GRPO = {"adv_estimator": "grpo", "gamma": 1.0, "lam": 1.0, "num_repeat": 2}
EPS = 1e-6
S = 0.5 / (math.sqrt(0.5) + EPS)  # two rollouts, rewards 1 and 0: +-1/sqrt(2)
Q1_MIXED = (0.25 / (0.5 + EPS), -0.75 / (0.5 + EPS))  # rows [1, 1, 1, 0]: mean .75, std .5
Q2_MIXED = 0.5 / (math.sqrt(1 / 3) + EPS)  # rows [1, 1, 0, 0]: std sqrt(1/3)
# one value per call, in batch order: r1a turns 0-2, r1b turn 0, r2a turns 0-1, r2b turns 0-1
EXPECTED = {
    # Agent Lightning 0.3's default, and 1.0's with enable_rollout_level_advantage: false
    "grpo_mixed": [*[Q1_MIXED[0]] * 3, Q1_MIXED[1], Q2_MIXED, Q2_MIXED, -Q2_MIXED, -Q2_MIXED],
    # 1.0's default (rollout-level), turnrl's grpo
    "grpo": [S, S, S, -S, S, S, -S, -S],
    # turn index within question: r1a's turns 1-2 and r2's turn 1 of different contexts
    "turn_group": [S, 0.0, 0.0, -S, S, S, -S, -S],
    # identical prompt tokens: only turn 0 of a question is shared (mean only)
    "node": [0.5, 0.0, 0.0, -0.5, 0.5, 0.0, -0.5, 0.0],
}


def test_rollout_level_advantage_against_turnrl_group_keys(v1) -> None:
    from verl.trainer.ppo.ray_trainer import compute_advantage

    batch = training_batch("transition")
    assert list(batch.non_tensor_batch["rollout_id_list"]) == [
        "r1a",
        "r1a",
        "r1a",
        "r1b",
        "r2a",
        "r2a",
        "r2b",
        "r2b",
    ]
    per_row = row_advantages(compute_advantage(training_batch("transition"), **GRPO))
    rollout_level, metrics = v1.compute_rollout_level_advantage(batch, **GRPO)
    assert metrics["training/rollout_level_advantage/n_rollouts"] == 4
    records = completed_rollouts_to_records(completed_rollouts())
    table = TurnTable.from_records(records)
    turnrl = {name: compute_advantages(table, name) for name in EXPECTED}
    for name, want in EXPECTED.items():
        np.testing.assert_allclose(turnrl[name], want, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(per_row, EXPECTED["grpo_mixed"], atol=1e-6)
    np.testing.assert_allclose(row_advantages(rollout_level), EXPECTED["grpo"], atol=1e-6)


def test_trajectory_rows_are_already_one_per_rollout(v1) -> None:
    """1.0's default trace_aggregator level merges a rollout's calls into one row when
    each prompt extends the previous context: then per-row GRPO is rollout-level."""
    from verl.trainer.ppo.ray_trainer import compute_advantage

    batch = training_batch("trajectory")
    assert list(batch.non_tensor_batch["rollout_id_list"]) == ["r1a", "r1b", "r2a", "r2b"]
    per_row = row_advantages(compute_advantage(training_batch("trajectory"), **GRPO))
    rollout_level = row_advantages(v1.compute_rollout_level_advantage(batch, **GRPO)[0])
    np.testing.assert_allclose(per_row, [S, -S, S, -S], atol=1e-6)
    np.testing.assert_allclose(rollout_level, [S, -S, S, -S], atol=1e-6)


def test_per_rollout_mean_loss_is_turnrl_rollout_mean(v1) -> None:
    """per_rollout_mean divides each token's advantage by (its rollout's tokens x rows):
    turnrl's rollout-mean weights up to the constant n_rollouts / n_rows."""
    import torch
    from agentlightning.verl.per_rollout_loss import normalize_advantages_by_rollout

    from turnrl.train.update.loss import aggregation_weights

    batch, _ = v1.compute_rollout_level_advantage(training_batch("transition"), **GRPO)
    mask = batch.batch["response_mask"]
    ids = batch.non_tensor_batch["rollout_id_list"]
    advantages = batch.batch["advantages"]
    scaled = normalize_advantages_by_rollout(advantages, mask, ids, num_trained_rows=len(batch))
    index = torch.tensor([["r1a", "r1b", "r2a", "r2b"].index(i) for i in ids])
    weights = aggregation_weights(mask, "rollout-mean", index).to(torch.float64)
    torch.testing.assert_close(
        scaled.double(), advantages.double() * weights * 4 / 8, atol=1e-7, rtol=0
    )
    per_rollout = [float((scaled * mask)[index == g].sum()) for g in range(4)]
    np.testing.assert_allclose(per_rollout, np.array([S, -S, S, -S]) / 8, atol=1e-7)


CALLS = [calls for _, _, _, calls, _ in BATCH]  # per rollout, in batch order


def token_values(per_call: list[float], level: str) -> list[list[float]]:
    """Per training row, the advantage of each trained token (2 per call)."""
    rows = [[v, v] for v in per_call]
    if level == "transition":
        return rows
    starts = itertools.accumulate(CALLS, initial=0)
    return [list(itertools.chain(*rows[a:b])) for a, b in itertools.pairwise(starts)]


def token_advantages(batch) -> list[list[float]]:
    mask = batch.batch["response_mask"].bool()
    return [batch.batch["advantages"][row][mask[row]].tolist() for row in range(len(batch))]


@pytest.fixture
def verl_hook():
    """turnrl's verl hook installed for one test (removed after, unless it already was)."""
    from verl.trainer.ppo import ray_trainer

    from turnrl.integrations.verl import hook

    was_installed = hasattr(ray_trainer.compute_advantage, "__turnrl_original__")
    hook.install()
    yield ray_trainer.compute_advantage
    if not was_installed:
        hook.uninstall()


@pytest.mark.parametrize("level", ["transition", "trajectory"])
def test_turnrl_estimators_on_1_0_batches_via_hook(v1, verl_hook, level: str) -> None:
    """With the rollout-level step off, 1.0's rows (one per call, or one per rollout with
    the calls as response-mask segments) get turnrl's per-call advantages."""
    for name in ("turn_group", "node", "grpo"):
        out = verl_hook(training_batch(level), adv_estimator=f"turnrl_{name}", config=None)
        want = token_values(EXPECTED[name], level)
        for got, expected in zip(token_advantages(out), want, strict=True):
            np.testing.assert_allclose(got, expected, atol=1e-6, err_msg=f"{level} {name}")


def test_rollout_level_step_keeps_one_value_per_rollout(v1, verl_hook) -> None:
    """A turnrl per-turn estimator inside 1.0's rollout-level step loses its per-call
    values: transition rows all get their rollout's first call's value; trajectory rows
    (several values in one row) are refused."""
    options = {**GRPO, "adv_estimator": "turnrl_turn_group", "compute_advantage_fn": verl_hook}
    out, _ = v1.compute_rollout_level_advantage(training_batch("transition"), **options)
    np.testing.assert_allclose(row_advantages(out), EXPECTED["grpo"], atol=1e-6)
    with pytest.raises(RuntimeError, match="scalar outcome-style advantages"):
        v1.compute_rollout_level_advantage(training_batch("trajectory"), **options)
