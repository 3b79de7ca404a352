"""Padded token batches <-> turn tables (turnrl.integrations.tokens; numpy only)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnrl.credit import compute_advantages
from turnrl.integrations.tokens import (
    build_table,
    context_node_ids,
    number_turns,
    scatter_to_tokens,
    split_turns,
)
from turnrl.table import TurnTable, default_node_id

MASK = np.array(
    [
        [1, 1, 0, 0, 1, 1, 0],  # two assistant segments
        [1, 0, 1, 0, 0, 0, 0],  # two segments
        [0, 0, 0, 0, 0, 0, 0],  # empty response: one empty turn
    ]
)


def test_split_turns_segments() -> None:
    turns = split_turns(MASK, one_turn_per_row=False)
    assert turns.row.tolist() == [0, 0, 1, 1, 2]
    assert turns.segment.tolist() == [0, 1, 0, 1, 0]
    assert turns.first.tolist() == [0, 2, 4]
    assert turns.count.tolist() == [2, 2, 1]
    assert turns.start.tolist() == [0, 4, 0, 2, 0]
    assert turns.token_turn.tolist() == [
        [0, 0, -1, -1, 1, 1, -1],
        [2, -1, 3, -1, -1, -1, -1],
        [-1] * 7,
    ]


def test_split_turns_one_per_row() -> None:
    turns = split_turns(MASK, one_turn_per_row=True)
    assert turns.row.tolist() == [0, 1, 2]
    assert turns.token_turn[0].tolist() == [0, 0, -1, -1, 0, 0, -1]


def test_per_turn_rewards_and_turn_group_exact() -> None:
    """Hand-computed: one task, three trajectories, rewards on segment ends and tool tokens."""
    rewards = np.zeros(MASK.shape)
    rewards[0, 5] = 1.0  # end of row 0's second segment -> turn 1 of traj 0
    rewards[1, 3] = 0.5  # tool token after row 1's second segment -> turn 1 of traj 1
    turns = split_turns(MASK, one_turn_per_row=False)
    table = build_table(turns, rewards, task_id=["q", "q", "q"])
    assert table.turn.tolist() == [0, 1, 0, 1, 0]
    assert table.reward.tolist() == [0.0, 1.0, 0.0, 0.5, 0.0]
    adv = compute_advantages(table, "turn_group", use_std=False)
    # turn 0 returns-to-go: 1, 0.5, 0 (mean 0.5); turn 1: 1, 0.5 (mean 0.75)
    assert adv.tolist() == pytest.approx([0.5, 0.25, 0.0, -0.25, -0.5])
    tokens = scatter_to_tokens(adv, turns)
    assert tokens.dtype == np.float32
    assert tokens[0].tolist() == pytest.approx([0.5, 0.5, 0, 0, 0.25, 0.25, 0])
    assert tokens[1].tolist() == pytest.approx([0, 0, -0.25, 0, 0, 0, 0])
    assert tokens[2].tolist() == [0.0] * 7


def test_reward_before_first_segment_goes_to_first_turn() -> None:
    mask = np.array([[0, 1, 1, 0, 1]])
    rewards = np.array([[2.0, 0, 0, 0, 3.0]])
    table = build_table(split_turns(mask, one_turn_per_row=False), rewards, task_id=["t"])
    assert table.reward.tolist() == [2.0, 3.0]


def test_trajectory_split_over_rows_continues_turns() -> None:
    mask = np.array([[1, 0, 1], [1, 1, 0], [1, 0, 1]])
    turns = split_turns(mask, one_turn_per_row=False)
    assert number_turns(turns, np.array([0, 1, 0])).tolist() == [0, 1, 0, 2, 3]


def test_broadcast_rewards_counted_once_on_last_turn() -> None:
    mask = np.ones((3, 2))
    rewards = np.array([[0, 1.0], [0, 1.0], [0, 0.0]])
    turns = split_turns(mask, one_turn_per_row=True)
    table = build_table(
        turns,
        rewards,
        task_id=["q"] * 3,
        traj_id=["a", "a", "b"],
        turn=[0, 1, 0],
        reward_mode="broadcast",
    )
    assert table.reward.tolist() == [0.0, 1.0, 0.0]


def test_broadcast_mismatch_names_rows() -> None:
    turns = split_turns(np.ones((2, 1)), one_turn_per_row=True)
    with pytest.raises(ValueError, match=r"rows \[0, 1\]"):
        build_table(
            turns,
            np.array([[1.0], [0.0]]),
            task_id=["q", "q"],
            traj_id=["a", "a"],
            turn=[0, 1],
            reward_mode="broadcast",
        )


def test_per_segment_fields_and_length_check() -> None:
    turns = split_turns(MASK, one_turn_per_row=False)
    table = build_table(
        turns,
        np.zeros(MASK.shape),
        task_id=["q"] * 3,
        state_key=[["s0", "s1"], "s2", None],
        role=["a", None, ["x"]],
    )
    assert [table.state_names[c] if c >= 0 else None for c in table.state_code] == [
        "s0",
        "s1",
        "s2",
        "s2",
        None,
    ]
    assert [table.role_names[c] for c in table.role_code] == ["a", "a", "agent", "agent", "x"]
    with pytest.raises(ValueError, match=r"'state_key', batch row 0: 1 values for 2 turns"):
        build_table(turns, np.zeros(MASK.shape), task_id=["q"] * 3, state_key=[["s0"], "s", "s"])


def test_context_node_ids_match_turn_records() -> None:
    mask = np.array([[1, 1, 0, 1]])
    response = np.array([[7, 8, 9, 10]])
    turns = split_turns(mask, one_turn_per_row=False)
    nodes = context_node_ids(np.array(["q", "q"], dtype=object), [[1, 2]], response, turns)
    assert nodes.tolist() == [
        default_node_id("q", [1, 2], None),
        default_node_id("q", [1, 2, 7, 8, 9], None),
    ]


@st.composite
def batches(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, list[str]]:
    n_rows = draw(st.integers(1, 6))
    n_tokens = draw(st.integers(1, 8))
    mask = np.array(
        draw(
            st.lists(
                st.lists(st.booleans(), min_size=n_tokens, max_size=n_tokens),
                min_size=n_rows,
                max_size=n_rows,
            )
        )
    )
    rewards = np.array(
        draw(
            st.lists(
                st.lists(
                    st.sampled_from([0.0, 0.0, 1.0, -0.5]), min_size=n_tokens, max_size=n_tokens
                ),
                min_size=n_rows,
                max_size=n_rows,
            )
        )
    )
    tasks = draw(st.lists(st.sampled_from(["a", "b"]), min_size=n_rows, max_size=n_rows))
    return mask, rewards, tasks


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(["grpo", "turn_group", "rloo", "grpo_mixed"]))
def test_segments_agree_with_independently_built_table(batch, estimator: str) -> None:
    """Tokens of one segment share one advantage, equal to the estimator on hand-split turns."""
    mask, rewards, tasks = batch
    turns = split_turns(mask, one_turn_per_row=False)
    table = build_table(turns, rewards, task_id=tasks)
    tokens = scatter_to_tokens(compute_advantages(table, estimator), turns)
    # independent reference: split each row by a plain Python scan
    rows: dict[str, list] = {k: [] for k in ("task", "traj", "turn", "reward")}
    spans = []
    for r in range(mask.shape[0]):
        segments: list[list[int]] = []
        for t in range(mask.shape[1]):
            if mask[r, t] and (t == 0 or not mask[r, t - 1]):
                segments.append([])
            if mask[r, t]:
                segments[-1].append(t)
        seg_rewards = [0.0] * max(len(segments), 1)
        for t in range(mask.shape[1]):
            started = [i for i, s in enumerate(segments) if s[0] <= t]
            seg_rewards[started[-1] if started else 0] += rewards[r, t]
        for i, reward in enumerate(seg_rewards):
            rows["task"].append(tasks[r])
            rows["traj"].append(f"row{r}")
            rows["turn"].append(i)
            rows["reward"].append(reward)
            spans.append((r, segments[i] if segments else []))
    expected = compute_advantages(
        TurnTable.from_arrays(
            task_id=rows["task"], traj_id=rows["traj"], turn=rows["turn"], reward=rows["reward"]
        ),
        estimator,
    )
    want = np.zeros(mask.shape, dtype=np.float32)
    for value, (r, positions) in zip(expected, spans, strict=True):
        want[r, positions] = value
    np.testing.assert_allclose(tokens, want, rtol=1e-6, atol=1e-6)
