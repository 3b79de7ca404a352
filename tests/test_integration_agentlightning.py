"""Agent Lightning rollouts <-> turn records, against the real agentlightning package.

Runs in the Agent Lightning venv (requirements/integrations-agl.txt); skipped where
agentlightning is not installed. The conversion of plain JSON dumps needs only
turnrl and runs everywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from turnrl.credit import compute_advantages
from turnrl.errors import TurnRecordError
from turnrl.integrations.agentlightning import (
    read_rollouts_jsonl,
    records_to_rollout,
    rollout_to_records,
    rollouts_to_records,
)
from turnrl.table import TurnTable, default_node_id

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "agentlightning"


def triplet(prompt: list[int], response: list[int], reward: float | None = None) -> dict:
    return {
        "prompt": {"token_ids": prompt},
        "response": {"token_ids": response, "logprobs": [{"logprob": -0.5}] * len(response)},
        "reward": reward,
        "metadata": {"agent_name": "solver", "response_id": f"r{len(prompt)}"},
    }


ROLLOUT = {
    "rollout_id": "ro-1",
    "final_reward": 1.0,
    "metadata": {"data_id": "q"},
    "triplets": [triplet([1, 2], [5, 6]), triplet([1, 2, 5, 6, 9], [7], 1.0)],
}


def test_rollout_to_records_fields() -> None:
    records = rollout_to_records(ROLLOUT)
    assert [(r.task_id, r.traj_id, r.turn, r.reward) for r in records] == [
        ("q", "ro-1", 0, 0.0),
        ("q", "ro-1", 1, 1.0),
    ]
    assert records[1].prompt_ids == (1, 2, 5, 6, 9)
    assert records[1].logprobs == (-0.5,)
    assert records[1].done and not records[0].done
    assert records[0].role == "solver"
    table = TurnTable.from_records(records)
    assert table.node_names[table.node_code[0]] == default_node_id("q", [1, 2], None)


def test_final_reward_rule_and_missing_reward() -> None:
    no_final = {**ROLLOUT, "final_reward": None}
    assert rollout_to_records(no_final)[-1].reward == 1.0  # last triplet reward that is set
    bare = {**no_final, "triplets": [triplet([1], [2])]}
    with pytest.raises(TurnRecordError, match="final_reward"):
        rollout_to_records(bare)
    assert rollout_to_records(bare, fillna=0.0)[0].reward == 0.0
    with pytest.raises(TurnRecordError, match="data_id"):
        rollout_to_records({**ROLLOUT, "metadata": {}})


def test_triplet_rewards_mode() -> None:
    rollout = {**ROLLOUT, "triplets": [triplet([1], [2], 0.25), triplet([1, 2, 3], [4], 1.0)]}
    assert [r.reward for r in rollout_to_records(rollout, rewards="triplet")] == [0.25, 1.0]
    assert [r.reward for r in rollout_to_records(rollout)] == [0.0, 1.0]


def test_default_grouping_is_grpo_mixed_on_the_example_logs() -> None:
    """Agent Lightning's default (uid = data id, final reward on every triplet) == grpo_mixed."""
    rollouts = read_rollouts_jsonl(EXAMPLE / "rollouts.jsonl")
    records = rollouts_to_records(rollouts)
    table = TurnTable.from_records(records)
    lengths = sorted(int(n) for n in table.traj_length)
    assert lengths == [1, 1, 2, 2, 3, 3, 4, 4]  # different numbers of turns per rollout
    final = {r["rollout_id"]: r["final_reward"] for r in rollouts}
    scores = np.array([final[r.traj_id] for r in records])
    tasks = np.array([r.task_id for r in records])
    want = np.zeros(len(records))
    for task in set(tasks):
        rows = tasks == task
        want[rows] = (scores[rows] - scores[rows].mean()) / (scores[rows].std(ddof=1) + 1e-6)
    np.testing.assert_allclose(compute_advantages(table, "grpo_mixed"), want, atol=1e-9)
    # turn 0 of every rollout of a question shares one exact context (node)
    turn0 = table.turn == 0
    assert len(set(table.node_code[turn0])) == 2


def test_turnrl_audit_cli_on_converted_logs(tmp_path: Path) -> None:
    from turnrl.records import dumps_record

    path = tmp_path / "turns.jsonl"
    records = rollouts_to_records(read_rollouts_jsonl(EXAMPLE / "rollouts.jsonl"))
    path.write_text("".join(dumps_record(r) + "\n" for r in records), encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "turnrl.cli", "audit", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "grouping by task mixes different prompts" in out.stdout


def test_example_runs(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE / "run.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "8 rollouts -> 20 turn records" in out.stdout
    assert (tmp_path / "runs" / "agl-turns.jsonl").exists()


# ----------------------------------------------------------------- real package
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch on import


@pytest.fixture(scope="module")
def agl():
    return pytest.importorskip(
        "agentlightning",
        reason="agentlightning is not installed (see requirements/integrations-agl.txt)",
    )


@pytest.mark.parametrize("where", ["metadata", "task"])
def test_real_rollout_round_trips(agl, where: str) -> None:
    """Triplets, rewards, the task and the metadata come back unchanged."""
    from agentlightning.types import RolloutLegacy, Task, Triplet

    task = Task(
        rollout_id="ro-7",
        input={"question": "2+2?", "answer": 4},
        mode="train",
        metadata={"data_id": "q-9"} if where == "task" else {"split": "a"},
    )
    rollout = RolloutLegacy(
        rollout_id="ro-7",
        task=task,
        final_reward=0.5,
        metadata={"data_id": "q-9", "note": [1, 2]} if where == "metadata" else {},
        triplets=[
            Triplet(**triplet([3, 4], [8, 9, 2])),
            Triplet(**triplet([3, 4, 8, 9, 2, 11], [12, 2], 0.5)),
            Triplet(**triplet([3, 4, 8, 9, 2, 11, 12, 2, 13], [14, 2])),
        ],
    )
    records = rollout_to_records(rollout)
    TurnTable.from_records(records)  # valid turn records
    assert {r.task_id for r in records} == {"q-9"}
    back = records_to_rollout(records)
    assert isinstance(back, RolloutLegacy)
    assert back.task == task
    assert back.model_dump() == rollout.model_dump()


def test_example_logs_are_real_rollout_dumps(agl) -> None:
    from agentlightning.types import RolloutLegacy

    for dump in read_rollouts_jsonl(EXAMPLE / "rollouts.jsonl"):
        rollout = RolloutLegacy.model_validate(dump)
        assert records_to_rollout(rollout_to_records(rollout)).model_dump() == rollout.model_dump()


def test_spans_through_agent_lightnings_trace_adapter(agl) -> None:
    """Spans as Agent Lightning's tracer stores them -> its TracerTraceToTriplet -> turn records."""
    from agentlightning.types import Span

    from turnrl.integrations.agentlightning import spans_to_records

    def llm_span(seq: int, prompt: list[int], response: list[int]) -> Span:
        return Span.from_attributes(
            name="openai.chat.completion",
            rollout_id="ro-3",
            attempt_id="at-1",
            sequence_id=seq,
            start_time=float(seq),
            end_time=float(seq) + 0.5,
            attributes={
                "prompt_token_ids": prompt,
                "response_token_ids": response,
                "gen_ai.response.id": f"resp-{seq}",
            },
        )

    reward = Span.from_attributes(
        name="agentlightning.annotation",
        rollout_id="ro-3",
        attempt_id="at-1",
        sequence_id=3,
        start_time=3.0,
        end_time=3.1,
        attributes={
            "agentlightning.reward.0.name": "primary",
            "agentlightning.reward.0.value": 1.0,
        },
    )
    spans = [llm_span(1, [1, 2], [5, 2]), llm_span(2, [1, 2, 5, 2, 7], [6, 2]), reward]
    records = spans_to_records(spans, task_id="q-3", rollout_id="ro-3")
    assert [r.prompt_ids for r in records] == [(1, 2), (1, 2, 5, 2, 7)]
    assert [r.response_ids for r in records] == [(5, 2), (6, 2)]
    assert [r.reward for r in records] == [0.0, 1.0]
    assert records[1].agl.response_id == "resp-2"


# ------------------------------------------------------- the store (0.3.0) and its spans
def llm_span(rollout_id: str, attempt_id: str, seq: int, ids: bool):
    from agentlightning.types import Span

    attributes = {
        "gen_ai.prompt.0.role": "user",
        "gen_ai.prompt.0.content": f"question {seq}",
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.content": "answer",
        "gen_ai.response.id": f"resp-{seq}",
    }
    if ids:
        attributes.update(prompt_token_ids=[1, 2, seq], response_token_ids=[5, seq])
    return Span.from_attributes(
        name="openai.chat.completion",
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=seq,
        start_time=float(seq),
        end_time=seq + 0.5,
        attributes=attributes,
    )


def reward_span(rollout_id: str, attempt_id: str, seq: int, value: float):
    from agentlightning.types import Span

    return Span.from_attributes(
        name="agentlightning.annotation",
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=seq,
        start_time=float(seq),
        end_time=seq + 0.1,
        attributes={
            "agentlightning.reward.0.name": "primary",
            "agentlightning.reward.0.value": value,
        },
    )


def store_rollout(ids: bool):
    """A rollout through Agent Lightning's real in-memory store: (AttemptedRollout, spans)."""
    import asyncio

    from agentlightning.store import InMemoryLightningStore

    async def run():
        store = InMemoryLightningStore()
        rollout = await store.start_rollout(
            input={"q": "2+2"}, mode="train", metadata={"data_id": "d-1"}
        )
        rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
        for span in (llm_span(rid, aid, 1, ids), llm_span(rid, aid, 2, ids)):
            await store.add_span(span)
        await store.add_span(reward_span(rid, aid, 3, 1.0))
        (stored,) = await store.query_rollouts()
        return stored, await store.query_spans(rid, aid)

    return asyncio.run(run())


def test_store_rollout_is_refused_with_what_to_pass(agl) -> None:
    rollout, _ = store_rollout(ids=True)
    assert type(rollout).__name__ == "AttemptedRollout"
    with pytest.raises(
        TurnRecordError, match=r"store rollout \(AttemptedRollout\).*spans_to_records"
    ):
        rollout_to_records(rollout)
    with pytest.raises(TurnRecordError, match="store rollout"):
        rollout_to_records(rollout.model_dump(mode="json"))  # its JSON dump too


def test_store_rollout_with_its_spans(agl) -> None:
    from turnrl.integrations.agentlightning import spans_to_records

    rollout, spans = store_rollout(ids=True)
    records = spans_to_records(spans, rollout=rollout)
    assert [(r.task_id, r.traj_id, r.turn) for r in records] == [
        ("d-1", rollout.rollout_id, 0),
        ("d-1", rollout.rollout_id, 1),
    ]
    assert [r.prompt_ids for r in records] == [(1, 2, 1), (1, 2, 2)]
    assert [r.reward for r in records] == [0.0, 1.0]
    other = [s.model_copy(update={"attempt_id": "at-other"}) for s in spans]
    with pytest.raises(ValueError, match="at-other"):
        spans_to_records(other, rollout=rollout)


def test_spans_without_token_ids_warn_once(agl, monkeypatch, caplog) -> None:
    import turnrl.integrations.agentlightning as module

    monkeypatch.setattr(module, "_warned_missing_ids", False)
    rollout, spans = store_rollout(ids=False)
    with caplog.at_level("WARNING", logger=module.__name__):
        records = module.spans_to_records(spans, rollout=rollout)
        again = module.spans_to_records(spans, rollout=rollout)
    assert records == again
    assert all(r.prompt_ids is None and r.response_ids is None for r in records)
    assert records[0].prompt == ({"role": "user", "content": "question 1"},)
    warned = [r.getMessage() for r in caplog.records if r.name == module.__name__]
    assert len(warned) == 1  # once, however many rollouts follow
    assert "2 of 2 triplets carry no prompt/response token ids" in warned[0]
    assert "node ids fall back to a hash of the prompt's chat JSON" in warned[0]
    # with token ids nothing is said
    monkeypatch.setattr(module, "_warned_missing_ids", False)
    caplog.clear()
    rollout, spans = store_rollout(ids=True)
    with caplog.at_level("WARNING", logger=module.__name__):
        module.spans_to_records(spans, rollout=rollout)
    assert not [r for r in caplog.records if r.name == module.__name__]
