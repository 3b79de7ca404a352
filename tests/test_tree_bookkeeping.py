"""Tree bookkeeping: shared nodes, copies, token counts, PATR pruning/expansion, scorers."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tree_scripted import ScriptedPolicy, SpyLearn, context
from turnrl.envs import CalculatorEnv, FrozenLakeEnv, make_env
from turnrl.rollout import RolloutBatch, get_strategy, start_episode
from turnrl.rollout.patr import Tree, prune, repeated, score_round
from turnrl.rollout.scorers import (
    ValueScorer,
    heuristic,
    judge,
    make_scorer,
    register_scorer,
)
from turnrl.rollout.tokens import PrefixReuse, token_metrics, trie_size
from turnrl.rollout.tree import Branch, branch, physical_env_steps, step_branches
from turnrl.table import TurnTable
from turnrl.types import Task, TurnRecord

torch.set_num_threads(1)

LAKE = Task("lake", {"map": ("SFFF", "FHFH", "FFFH", "HFFG"), "size": 4, "seed": 0})
"""gymnasium's classic 4x4 map: start 0, goal 15, holes 5, 7, 11, 12."""


def lake_env():
    return FrozenLakeEnv(max_turns=8)


def moves(*texts):
    """A script answering row i of every call with ``texts[i % len(texts)]``."""
    return lambda ctx, call, row: f"<answer>{texts[row % len(texts)]}</answer>"


def test_trie_size_and_token_metrics_on_a_hand_built_tree() -> None:
    assert trie_size([[1, 2, 3], [1, 2, 4], [1, 5]]) == 5
    assert trie_size([]) == 0 and trie_size([[7], [7]]) == 1
    a = {"task_id": "t", "traj_id": "a"}
    b = {"task_id": "t", "traj_id": "b"}
    records = [
        TurnRecord(**a, turn=0, prompt_ids=[1, 2], response_ids=[3]),
        TurnRecord(**a, turn=1, prompt_ids=[1, 2, 3, 9], response_ids=[4]),
        TurnRecord(**b, turn=0, prompt_ids=[1, 2], response_ids=[3], copy_of="a"),
        TurnRecord(**b, turn=1, prompt_ids=[1, 2, 3, 9], response_ids=[5]),
        TurnRecord(task_id="u", traj_id="c", turn=0, prompt_ids=[1, 2], response_ids=[6]),
    ]
    metrics = token_metrics(records, computed=8)
    # a = [1,2,3,9,4], b = [1,2,3,9,5] share 4 tokens; task u is its own tree.
    assert metrics["tokens_all"] == 5 + 5 + 3
    assert metrics["tokens_unique"] == 6 + 3
    assert metrics["computed_over_unique"] == pytest.approx(8 / 9)
    assert physical_env_steps(records) == 4


def test_a_branch_copies_its_path_and_siblings_share_a_node() -> None:
    policy = ScriptedPolicy(moves("right", "down"))
    ctx = context(policy, lake_env, SpyLearn())
    batch = RolloutBatch(records=[], episodes=[])
    parent = Branch(start_episode(policy, lake_env, LAKE, "p"))
    step_branches(policy, [parent], batch, ctx, seed=0, max_turns=8)  # right: cell 1
    child = branch(parent, lake_env, "c")
    assert child.episode.env.state_key() == parent.episode.env.state_key() == "lake:1"
    step_branches(policy, [parent, child], batch, ctx, seed=1, max_turns=8)  # right / down
    assert parent.episode.env.state_key() == "lake:2"
    assert child.episode.env.state_key() == "lake:5"  # a hole: the child is done
    assert child.episode.done and not child.episode.correct
    records = parent.records + child.records
    assert [r.copy_of for r in child.records] == ["p", None]
    assert physical_env_steps(records) == 3 == len(batch.records)
    table = TurnTable.from_records(records)  # every path is a valid trajectory
    node = table.node_code
    assert node[0] == node[2]  # the shared turn 0 and its copy: one decision point
    assert node[1] == node[3]  # the two turn-1 responses: siblings of one state
    assert node[0] != node[1]
    assert records[1].response != records[3].response


def lake_tree(policy, ctx, n: int, budget: int) -> Tree:
    tree = Tree("t", budget=budget)
    for _ in range(n):
        tree.branches.append(Branch(start_episode(policy, lake_env, LAKE, tree.next_id())))
    step_branches(policy, tree.branches, RolloutBatch([], []), ctx, seed=0, max_turns=8)
    return tree


def fixed(scores):
    return lambda branches, policy: list(scores[: len(branches)])


def test_score_round_prunes_below_median_minus_alpha_and_expands_the_best() -> None:
    policy = ScriptedPolicy(moves("right"))
    ctx = context(policy, lake_env, SpyLearn())
    tree = lake_tree(policy, ctx, 4, budget=8)
    # median of [3, 2, 1, 0.4] is 1.5: below 1.0 is pruned; exactly 1.0 would stay.
    score_round(tree, fixed([3, 2, 1, 0.4]), policy, lake_env, top_k=2, children=2, alpha=0.5)
    ids = [b.traj_id for b in tree.branches]
    assert ids == ["t.0", "t.1", "t.2", "t.3", "t.4", "t.5"]
    assert [b.pruned for b in tree.branches] == [False, False, False, True, False, False]
    pruned = tree.branches[3]
    assert pruned.episode.end == "pruned" and pruned.episode.correct is False
    assert pruned.records[-1].pruned is True
    # children of t.0 and t.1 (the top 2), copies of their parents' paths
    assert [r.copy_of for r in tree.branches[4].records] == ["t.0"]
    assert [r.copy_of for r in tree.branches[5].records] == ["t.1"]
    assert tree.expansions == 2
    boundary = lake_tree(policy, ctx, 4, budget=8)
    score_round(boundary, fixed([3, 2, 1, 1.0]), policy, lake_env, top_k=0, children=2, alpha=0.5)
    assert not any(b.pruned for b in boundary.branches)


def test_score_round_respects_the_leaf_budget() -> None:
    policy = ScriptedPolicy(moves("right"))
    ctx = context(policy, lake_env, SpyLearn())
    tree = lake_tree(policy, ctx, 4, budget=5)
    score_round(tree, fixed([3, 2, 1, 1]), policy, lake_env, top_k=2, children=2, alpha=0.5)
    assert len(tree.branches) == 5 and tree.expansions == 1
    assert tree.branches[4].records[0].copy_of == "t.0"  # the best one was expanded
    wide = lake_tree(policy, ctx, 2, budget=8)
    score_round(wide, fixed([1, 1]), policy, lake_env, top_k=1, children=4, alpha=0.5)
    assert len(wide.branches) == 5  # one parent becomes 4 children: +3 leaves


def test_repeats_prune_rule() -> None:
    def with_responses(texts):
        b = Branch(start_episode(ScriptedPolicy(moves("up")), lake_env, LAKE, "x"))
        b.records = [
            TurnRecord(task_id="t", traj_id="x", turn=k, response=t) for k, t in enumerate(texts)
        ]
        return b

    assert repeated(with_responses(["<answer>up</answer>"] * 6), 6)
    assert repeated(with_responses(["left", " LEFT", "left ", "left", "Left", "left"]), 6)
    assert not repeated(with_responses(["up"] * 5), 6)
    assert not repeated(with_responses(["up"] * 5 + ["down"]), 6)
    assert not repeated(with_responses(["up"] * 9), 0)  # 0 disables the rule
    b = with_responses(["up"])
    prune(b)
    assert b.pruned and not b.active and b.records[-1].pruned


def random_mover(seed: int):
    def script(ctx: str, call: int, row: int) -> str:
        rng = random.Random(hash((ctx, call, row, seed)) % 2**32)
        return f"<answer>{rng.choice(['left', 'down', 'right', 'up'])}</answer>"

    return script


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_patr_trees_are_valid_budgeted_and_copies_match_originals(seed: int) -> None:
    policy = ScriptedPolicy(random_mover(seed))
    learn = SpyLearn("grpo")
    ctx = context(policy, lake_env, learn, seed=seed)
    tasks = [LAKE, Task("lake2", {**LAKE.payload, "seed": 1})]
    exp = get_strategy("patr")(ctx, tasks, 6, interval=1, repeats=3)
    records = exp.batch.records
    table = TurnTable.from_records(records)
    assert len(learn.calls) == 1  # one update, on every row (copies included)
    assert all(a is b for a, b in zip(learn.calls[0], records, strict=True))
    per_task = {}
    for e in exp.batch.episodes:
        per_task[e.task.task_id] = per_task.get(e.task.task_id, 0) + 1
    assert all(4 <= n <= 6 for n in per_task.values())
    assert table.n_trajectories == len(exp.batch.episodes) == exp.extra["leaves"]
    originals = {(r.traj_id, r.turn): r for r in records if not r.copy_of}
    for r in records:
        if r.copy_of:
            source = originals[(r.copy_of, r.turn)]
            assert r.prompt_ids == source.prompt_ids
            assert r.response_ids == source.response_ids
    # every physical step is one sampled response: copies are free
    assert physical_env_steps(records) == sum(len(c) for c in policy.contexts)
    assert exp.extra["rollout_env_steps"] == physical_env_steps(records)
    # who is a negative: pruned leaves end unsuccessful, and GRPO never rewards them
    for e in exp.batch.episodes:
        if e.end == "pruned":
            assert e.correct is False
    outcome = {}
    for r in records:
        outcome[r.traj_id] = outcome.get(r.traj_id, 0.0) + r.reward
    for r in records:
        if r.pruned:
            peers = [outcome[e.traj_id] for e in exp.batch.episodes if e.task.task_id == r.task_id]
            advantage = learn.advantage[(r.traj_id, r.turn)]
            assert advantage <= 0 or outcome[r.traj_id] > np.mean(peers)


def test_patr_prunes_a_branch_that_repeats_itself() -> None:
    policy = ScriptedPolicy(moves("up"))  # "up" from the start: stays put forever
    learn = SpyLearn("grpo")
    ctx = context(policy, lake_env, learn)
    exp = get_strategy("patr")(ctx, [LAKE], 4, interval=100, repeats=3)
    assert [e.end for e in exp.batch.episodes] == ["pruned"] * 4
    assert all(e.turn == 3 for e in exp.batch.episodes)
    assert exp.extra["pruned_leaves"] == 4


def test_atgrpo_candidates_share_a_node_and_the_best_one_advances() -> None:
    # row 0 of a call: "up" (stays), row 1: "right", row 2: malformed.
    def script(ctx, call, row):
        return ["<answer>up</answer>", "<answer>right</answer>", "oops"][row % 3]

    policy = ScriptedPolicy(script)
    learn = SpyLearn("node", gamma=0.0, use_std=True)
    ctx = context(policy, lake_env, learn)
    exp = get_strategy("atgrpo")(ctx, [LAKE], 3, max_turns=3)
    records = exp.batch.records
    table = TurnTable.from_records(records)
    main = [r for r in records if r.traj_id == "s1-lake#0"]
    # "right" is always closest to the goal (the heuristic breaks the 0-reward ties)
    assert [r.response for r in main] == ["<answer>right</answer>"] * 3
    assert len(policy.contexts) == 3 and all(len(c) == 3 for c in policy.contexts)
    trained = [i for i, r in enumerate(records) if r.train]
    assert len(trained) == 9  # 3 candidates x 3 turns
    for turn in range(3):
        rows = [i for i in trained if records[i].turn == turn]
        assert len(rows) == 3 and len({int(table.node_code[i]) for i in rows}) == 1
    untrained = [r for r in records if r.train is False]
    assert all(r.copy_of == "s1-lake#0" for r in untrained)
    assert len({r.node_id for r in untrained}) == len(untrained)
    assert exp.extra["rollout_env_steps"] == 9


# ----------------------------------------------------------------------- scorers


def test_heuristic_scores() -> None:
    policy = ScriptedPolicy(moves("right", "down"))
    ctx = context(policy, lake_env, SpyLearn())
    start = Branch(start_episode(policy, lake_env, LAKE, "a"))
    assert heuristic([start], policy) == [-6.0]
    two = [Branch(start_episode(policy, lake_env, LAKE, f"b{i}")) for i in range(2)]
    step_branches(policy, two, RolloutBatch([], []), ctx, seed=0, max_turns=8)
    # right -> cell 1 (distance 5); down -> cell 4 (distance 5)
    assert heuristic(two, policy) == [-5.0, -5.0]
    step_branches(policy, two, RolloutBatch([], []), ctx, seed=0, max_turns=8)
    # b0: right again -> cell 2 (distance 4); b1: down from 4 -> cell 8 (distance 4)
    assert heuristic(two, policy) == [-4.0, -4.0]
    assert judge(two, policy) == [-0.25, -0.25] and judge([start], policy) == [0.0]

    calc_task = Task("c", {"question": "Compute 2+3.", "expression": "2+3", "answer": 5.0})
    calls = ScriptedPolicy(lambda c, call, row: ["<call>2+3</call>", "???"][row])
    cctx = context(calls, CalculatorEnv, SpyLearn())
    cb = [Branch(start_episode(calls, CalculatorEnv, calc_task, f"c{i}")) for i in range(2)]
    step_branches(calls, cb, RolloutBatch([], []), cctx, seed=0, max_turns=4)
    assert heuristic(cb, calls) == [0.5, -0.5]


def test_make_scorer_blend_value_hook_and_errors() -> None:
    policy = ScriptedPolicy(moves("right"))
    start = [Branch(start_episode(policy, lake_env, LAKE, "a"))]
    register_scorer("test-length", lambda: ValueScorer(lambda ctxs: [len(c) for c in ctxs]))
    length = len(start[0].episode.context)
    assert make_scorer("test-length")(start, policy) == [float(length)]
    blend = make_scorer({"heuristic": 1.0, "test-length": 0.5})
    assert blend(start, policy) == [-6.0 + 0.5 * length]
    with pytest.raises(ValueError, match="unknown scorer 'nope'"):
        make_scorer("nope")
    with pytest.raises(ValueError, match="cannot load"):
        make_scorer("turnrl.no_such_module:factory")
    with pytest.raises(ValueError, match="already registered"):
        register_scorer("judge", lambda: judge)
    with pytest.raises(ValueError, match="returned 2 scores for 1"):
        ValueScorer(lambda ctxs: [1.0, 2.0])(start, policy)


def test_prefix_reuse_falls_back_for_policies_without_a_cache() -> None:
    policy = ScriptedPolicy(moves("up"))
    wrapped = PrefixReuse(policy)
    assert wrapped.cache is None and wrapped.tokens_computed is None
    assert wrapped.eos_token_id == policy.eos_token_id
    ctx = make_env("frozenlake")
    messages = ctx.reset(LAKE)
    ids = wrapped.encode_initial(messages)
    assert wrapped.sample([ids], max_new_tokens=20)[0].text == "<answer>up</answer>"
