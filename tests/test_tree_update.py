"""``update = "tree"`` against ``update = "rows"``: same gradients and loss statistics on
hand-built trees, for every aggregation mode, with clip factors and KL, whatever the token
budget; mini-batches of whole trees; the update's token counts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import GradientRecorder
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.records import parse_record
from turnrl.table import TurnTable
from turnrl.train.update.loss import AGGREGATIONS
from turnrl.train.update.minibatches import minibatch_count, tree_minibatches
from turnrl.train.update.ppo import PPOConfig, build_update_batch, merge_loss_stats, ppo_update
from turnrl.types import TurnRecord

torch.set_num_threads(1)


def _policy() -> HFPolicy:
    return build_tiny_policy(seed=11, hidden=32, layers=2)


def _tree_records(policy: HFPolicy) -> list[dict]:
    """Four hand-built task trees (turn records as the strategies write them):

    * ``shared``: three one-turn rollouts of one prompt, two of them identical samples;
    * ``multi``: a three-turn trajectory (each context extends the previous turn) and a
      second one whose first response branches from the first's in mid-turn;
    * ``patr``: a PATR tree: the leaves share turn 0 (``b`` holds a trained copy of
      ``a``'s), then branch at turn 1;
    * ``rtpo``: an RTPO step: a trunk that is not trained (``train = false``), two
      siblings at turn 1 sharing the trunk's turn 0 (copies, not trained) and each
      continuing (continuations not trained).
    """
    system = {"role": "system", "content": "Use calc(...) or <answer>n</answer>."}
    eot = policy.eos_token_id

    def said(text: str) -> list[int]:
        return [*policy.tokenizer(text, add_special_tokens=False)["input_ids"], eot]

    def tool(result: str) -> list[int]:
        return policy.encode_observation({"role": "tool", "content": result})

    records: list[TurnRecord] = []

    def add(task: str, traj: str, turn: int, context: list[int], response: list[int], **extra):
        rng = np.random.default_rng(len(records))
        records.append(
            parse_record(
                {
                    "task_id": task,
                    "traj_id": traj,
                    "turn": turn,
                    "prompt_ids": list(context),
                    "response_ids": list(response),
                    # Behaviour log-probs away from the current ones: ratios far from 1.
                    "logprobs": list(rng.uniform(-4.0, -2.5, len(response))),
                    "reward": 0.0,
                    **extra,
                }
            )
        )
        return [*context, *response]

    def start(question: str) -> list[int]:
        return policy.encode_initial([system, {"role": "user", "content": question}])

    q = start("2+3?")
    add("shared", "s0", 0, q, said("<answer>5</answer>"), reward=1.0, done=True)
    add("shared", "s1", 0, q, said("<answer>5</answer>"), reward=1.0, done=True)
    add("shared", "s2", 0, q, said("<answer>6</answer>"), done=True)

    q = start("17*23?")
    a = add("multi", "m0", 0, q, said("calc(17*23)"))
    a = add("multi", "m0", 1, [*a, *tool("391")], said("calc(391+0)"))
    add("multi", "m0", 2, [*a, *tool("391")], said("<answer>391</answer>"), reward=1.0, done=True)
    b = add("multi", "m1", 0, q, said("calc(17+23)"))  # branches after "calc(17"
    add("multi", "m1", 1, [*b, *tool("40")], said("<answer>40</answer>"), done=True)

    q = start("9-4?")
    shared = add("patr", "pa", 0, q, said("calc(9-4)"))
    add("patr", "pb", 0, q, said("calc(9-4)"), copy_of="pa")
    add("patr", "pa", 1, [*shared, *tool("5")], said("<answer>5</answer>"), reward=1.0, done=True)
    add("patr", "pb", 1, [*shared, *tool("5")], said("<answer>4</answer>"), done=True)

    q = start("8/2?")
    trunk = add("rtpo", "trunk", 0, q, said("calc(8/2)"), train=False)
    add("rtpo", "trunk", 1, [*trunk, *tool("4")], said("<answer>4</answer>"), train=False,
        reward=1.0, done=True)  # fmt: skip
    for sibling, answer in (("r1", "<answer>4</answer>"), ("r2", "calc(8*2)")):
        add("rtpo", sibling, 0, q, said("calc(8/2)"), copy_of="trunk", train=False)
        after = add("rtpo", sibling, 1, [*trunk, *tool("4")], said(answer))
        if sibling == "r2":
            add("rtpo", sibling, 2, [*after, *tool("16")], said("<answer>16</answer>"),
                train=False, done=True)  # fmt: skip
    return records


def _batch(policy: HFPolicy, aggregation: str, *, clip: bool = True):
    records = _tree_records(policy)
    table = TurnTable.from_records(records)
    advantages = np.linspace(-1.5, 1.5, len(records))
    factor = np.linspace(0.3, 1.2, len(records)) if clip else None
    return build_update_batch(records, table, advantages, factor, aggregation)


def _reference(policy: HFPolicy) -> HFPolicy:
    reference = policy.clone_frozen()
    with torch.no_grad():
        for p in reference.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    return reference


def _run(policy, batch, config, reference):
    recorder = GradientRecorder(policy.parameters())
    stats = ppo_update(
        policy, recorder, batch, config, temperature=0.9, reference=reference, seed=3
    )
    return recorder.steps, stats


def _assert_same_gradients(expected, got) -> None:
    assert len(expected) == len(got)
    for e, g in zip(expected, got, strict=True):
        assert torch.linalg.vector_norm(e - g) <= 1e-4 * torch.linalg.vector_norm(e)


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
def test_tree_update_has_the_gradients_of_the_rows_update(aggregation: str) -> None:
    policy = _policy()
    batch = _batch(policy, aggregation)
    reference = _reference(policy)
    config = PPOConfig(minibatch_size=64, kl_coef=0.3, clip_low=0.2, clip_high=0.28)
    (rows,), row_stats = _run(policy, batch, replace(config, update="rows"), reference)
    (tree,), tree_stats = _run(policy, batch, replace(config, update="tree"), reference)
    _assert_same_gradients(rows, tree)
    assert sum(float(g.norm()) for g in rows) > 1e-3
    # A budget far below one tree: forwards cut at subtree boundaries, same step.
    (split,), split_stats = _run(
        policy, batch, replace(config, update="tree", max_tokens_per_batch=120), reference
    )
    _assert_same_gradients(rows, split)
    for key in ("loss", "pg_loss", "kl_loss", "kl_ref", "ratio_mean", "clip_frac", "n_tokens"):
        assert tree_stats[key] == pytest.approx(row_stats[key], rel=1e-4, abs=1e-6), key
        assert split_stats[key] == pytest.approx(row_stats[key], rel=1e-4, abs=1e-6), key
    assert 0 < row_stats["clip_frac"] < 1  # the clip factors matter here
    assert row_stats["kl_ref"] > 1e-4
    # What each layout computed: rows = every row in full, packed into bins up to the
    # longest row (the bins' tails are padding; padded rows would run rows x longest);
    # tree = the distinct prefixes.
    sizes = [len(c) + len(r) for c, r in zip(batch.contexts, batch.responses, strict=True)]
    assert sum(sizes) == row_stats["update_tokens_rows"]
    assert sum(sizes) <= row_stats["update_tokens_computed"] <= len(sizes) * max(sizes)
    assert tree_stats["update_tokens_rows"] == row_stats["update_tokens_rows"]
    assert tree_stats["update_tokens_computed"] < tree_stats["update_tokens_unique"]
    assert split_stats["update_tokens_computed"] > tree_stats["update_tokens_computed"]
    assert tree_stats["update_activation_mib"] < row_stats["update_activation_mib"]


def test_several_minibatches_keep_trees_whole_and_the_mean_gradient() -> None:
    policy = _policy()
    batch = _batch(policy, "token-mean", clip=False)
    config = PPOConfig(minibatch_size=64, update="rows")
    (whole,), _ = _run(policy, batch, config, None)
    # 14 trained rows (3 + 5 + 4 + 2: rtpo's trunk, copies and continuations are not),
    # minibatch_size 5: ceil(14 / 5) = 3 optimiser steps, each of whole trees.
    assert len(batch.contexts) == 14
    steps, _ = _run(policy, batch, replace(config, update="tree", minibatch_size=5), None)
    assert len(steps) == 3
    for full, *parts in zip(whole, *steps, strict=True):
        torch.testing.assert_close(torch.stack(parts).mean(0), full, rtol=1e-4, atol=1e-7)


def test_tree_minibatches_hand_built() -> None:
    trees = [0, 0, 0, 1, 2, 2, 3, 3, 3, 3]  # tree sizes 3, 1, 2, 4
    # ceil(10 / 4) = 3 mini-batches: the shuffled trees are cut where the running count of
    # rows passes 10/3 and 20/3. Seed 0 shuffles the trees to [0, 1, 3, 2]: 3, 4 (cut),
    # 8 (cut), 10.
    assert torch.randperm(4, generator=torch.Generator().manual_seed(0)).tolist() == [0, 1, 3, 2]
    groups = tree_minibatches(trees, 4, torch.Generator().manual_seed(0))
    assert groups == [[0, 1, 2, 3], [6, 7, 8, 9], [4, 5]]
    # Seed 1: [1, 3, 2, 0]: 1, 5 (cut), 7 (cut), 10.
    groups = tree_minibatches(trees, 4, torch.Generator().manual_seed(1))
    assert groups == [[3, 6, 7, 8, 9], [4, 5], [0, 1, 2]]
    # More mini-batches than trees would need: one per tree, never an empty one.
    groups = tree_minibatches([0, 1, 2, 2, 2, 2, 2, 2], 2, torch.Generator().manual_seed(0))
    assert sorted(map(len, groups)) == [1, 1, 6]
    assert tree_minibatches([5, 5, 5], 1, torch.Generator()) == [[0, 1, 2]]  # one tree


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=30), st.integers(1, 12), st.integers(0, 9))
def test_tree_minibatches_invariants(trees, size, seed) -> None:
    groups = tree_minibatches(trees, size, torch.Generator().manual_seed(seed))
    assert sorted(b for g in groups for b in g) == list(range(len(trees)))
    assert all(groups)
    assert len(groups) == min(minibatch_count(len(trees), size), len(set(trees)))
    home = {trees[b]: i for i, g in enumerate(groups) for b in g}
    assert all(home[trees[b]] == i for i, g in enumerate(groups) for b in g)


def test_token_counts_on_raw_ids() -> None:
    policy = _policy()
    records = [
        {"task_id": "a", "traj_id": "x", "turn": 0, "prompt_ids": [1, 2, 3],
         "response_ids": [4, 5], "logprobs": [-1.0, -1.0]},
        {"task_id": "a", "traj_id": "y", "turn": 0, "prompt_ids": [1, 2, 3],
         "response_ids": [4, 6], "logprobs": [-1.0, -1.0]},
        {"task_id": "b", "traj_id": "z", "turn": 0, "prompt_ids": [1, 2, 7],
         "response_ids": [8], "logprobs": [-1.0]},
    ]  # fmt: skip
    records = [parse_record(r) for r in records]
    batch = build_update_batch(
        records, TurnTable.from_records(records), np.ones(3), None, "token-mean"
    )
    config = PPOConfig(minibatch_size=8, epochs=2)
    _, stats = _run(policy, batch, config, None)
    assert stats["update_tokens_rows"] == 2 * (5 + 5 + 4)
    # Per task: a = 1-2-3-4-{5,6} (6 nodes), b = 1-2-7-8 (4 nodes).
    assert stats["update_tokens_unique"] == 2 * (6 + 4)
    # One forward per epoch over both tasks: 1-2-{3-4-{5,6}, 7-8} = 8 positions.
    assert stats["update_tokens_computed"] == 2 * 8


def test_merge_loss_stats_sums_and_weights_by_tokens() -> None:
    parts = [
        {"loss": 1.0, "pg_loss": 0.5, "kl_loss": 0.5, "clip_frac": 0.5, "n_tokens": 2.0},
        {"loss": 2.0, "pg_loss": 2.0, "kl_loss": 0.0, "clip_frac": 0.0, "n_tokens": 6.0},
    ]
    merged = merge_loss_stats(parts)
    assert merged == {
        "loss": 3.0,
        "pg_loss": 2.5,
        "kl_loss": 0.5,
        "clip_frac": pytest.approx(0.125),
        "n_tokens": 8.0,
    }


@pytest.mark.parametrize(("trees", "size"), [(2, 4), (2, 6), (3, 6), (1, 3)])
@pytest.mark.parametrize("seed", range(4))
def test_tree_minibatches_cut_evenly_at_an_exact_boundary(trees: int, size: int, seed: int) -> None:
    # Twelve trees of `trees` rows each, `size` rows per mini-batch: every boundary
    # (a multiple of `size`) falls exactly after a whole tree, so every mini-batch holds
    # exactly `size` rows; a cut made one tree late would give the first one more.
    tree_B = [t for t in range(12) for _ in range(trees)]
    groups = tree_minibatches(tree_B, size, torch.Generator().manual_seed(seed))
    assert [len(g) for g in groups] == [size] * (12 * trees // size)


@pytest.mark.parametrize(
    ("update", "draw"), [("rows", "row_minibatches"), ("tree", "tree_minibatches")]
)
def test_each_epoch_draws_a_new_minibatch_order(monkeypatch, update: str, draw: str) -> None:
    """The epochs of one update continue one seeded stream of orders: the second
    epoch's mini-batches are the stream's second draw, not the first one again."""
    import turnrl.train.update.ppo as ppo

    drawn: list[list[list[int]]] = []
    real = getattr(ppo, draw)

    def recording(*args):
        drawn.append(real(*args))
        return drawn[-1]

    monkeypatch.setattr(ppo, draw, recording)
    policy = _policy()
    batch = _batch(policy, "token-mean", clip=False)
    config = PPOConfig(minibatch_size=5, epochs=3, update=update)
    steps, _ = _run(policy, batch, config, None)  # _run's seed is 3
    generator = torch.Generator().manual_seed(3)
    first = batch.tree_B.tolist() if update == "tree" else len(batch.contexts)
    expected = [real(first, 5, generator) for _ in range(3)]
    assert drawn == expected
    assert drawn[0] != drawn[1] != drawn[2]
    assert len(steps) == sum(len(groups) for groups in expected)
