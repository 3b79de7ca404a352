"""RTPO: reverse turn order, one turn trained per update (frozen afterwards), exact
contexts and log-probs, sibling-mean advantages, the trunk in no baseline."""

from __future__ import annotations

import pytest
import torch

from tree_scripted import ScriptedPolicy, SpyLearn, context, is_trained
from turnrl.envs import CalculatorEnv, FrozenLakeEnv
from turnrl.policy import build_tiny_policy
from turnrl.rollout import get_strategy
from turnrl.table import TurnTable
from turnrl.types import Task

torch.set_num_threads(1)

LAKE = Task("lake", {"map": ("SFFF", "FHFH", "FFFH", "HFFG"), "size": 4, "seed": 0})
CALC = Task("calc", {"question": "Compute 2+3.", "expression": "2+3", "answer": 5.0})


def stuck(ctx, call, row):
    return "<answer>up</answer>"  # never moves: every episode lasts max_turns


def test_updates_run_from_the_last_turn_back_and_train_each_turn_once() -> None:
    policy = ScriptedPolicy(stuck)
    learn = SpyLearn("node")
    ctx = context(policy, lambda: FrozenLakeEnv(max_turns=4), learn)
    tasks = [LAKE, Task("lake-b", {**LAKE.payload, "seed": 1})]
    exp = get_strategy("rtpo")(ctx, tasks, 3, skip_ties=False)  # 2 siblings per turn
    assert len(learn.calls) == 4 == exp.extra["updates"]
    trained_turns = [sorted({r.turn for r in learn.trained(i)}) for i in range(4)]
    assert trained_turns == [[3], [2], [1], [0]]  # reverse order, one turn each
    for i, k in enumerate([3, 2, 1, 0]):
        rows = learn.trained(i)
        assert len(rows) == 2 * 2  # 2 siblings x 2 tasks
        assert {r.traj_id for r in rows} == {
            f"s1-{t.task_id}#{n}.k{k}.{j}" for n, t in enumerate(tasks) for j in range(2)
        }
        TurnTable.from_records(learn.calls[i])  # each sibling is a valid full trajectory
        untrained = [r for r in learn.calls[i] if not is_trained(r)]
        assert all(r.turn != k for r in untrained)
        assert all(not r.traj_id.endswith("#0") for r in learn.calls[i])  # no trunk rows
    # the trunk is logged, never trained, and its nodes are its own
    trunk = [r for r in exp.batch.records if r.traj_id in ("s1-lake#0", "s1-lake-b#1")]
    assert len(trunk) == 8 and all(r.train is False for r in trunk)
    assert all(r.node_id.startswith("solo:") for r in trunk)
    # physical steps: trunk 4 + siblings (4 + 3 + 2 + 1) * 2, per task; copies are free
    assert exp.extra["rollout_env_steps"] == 2 * (4 + 2 * 10)
    assert sum(len(c) for c in policy.contexts) == exp.extra["rollout_env_steps"]


def test_sibling_advantage_is_return_minus_the_sibling_mean() -> None:
    # calls: 0 trunk turn 0 (tool), 1 trunk turn 1 (right answer),
    # 2 siblings at k=1 (right, wrong), 3 siblings at k=0 (right, wrong: direct answers)
    def script(ctx, call, row):
        if call == 0:
            return "<call>2+3</call>"
        if call == 1:
            return "<answer>5</answer>"
        return ["<answer>5</answer>", "<answer>4</answer>"][row]

    learn = SpyLearn("node")
    ctx = context(ScriptedPolicy(script), CalculatorEnv, learn)
    get_strategy("rtpo")(ctx, [CALC], 3)
    for call, k in ((0, 1), (1, 0)):
        rows = learn.calls[call]
        trained = [r for r in rows if is_trained(r)]
        assert [r.turn for r in trained] == [k, k]
        assert learn.advantages(trained) == [0.5, -0.5]
        assert all(a == 0.0 for a in learn.advantages([r for r in rows if not is_trained(r)]))
        # the trunk's own turn-k reward (1.0) did not enter the siblings' mean
        assert [r.reward for r in trained] == [1.0, 0.0]


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_training_context_is_the_sampling_context_and_log_probs_match(prefix_cache) -> None:
    policy = build_tiny_policy(seed=2)
    sampled: list[list[int]] = []
    sample = policy.sample

    def spy_sample(contexts, *, prefix_cache=None, **kwargs):
        sampled.extend(list(c) for c in contexts)
        return sample(contexts, prefix_cache=prefix_cache, **kwargs)

    policy.sample = spy_sample  # type: ignore[method-assign]
    checks: list[int] = []

    def check_then_update():
        rows = learn.trained(len(learn.calls) - 1)
        with torch.no_grad():
            logp, _ = policy.response_logprobs(
                [r.prompt_ids for r in rows], [r.response_ids for r in rows]
            )
        for i, r in enumerate(rows):
            assert list(r.prompt_ids) in sampled  # exactly a context the policy sampled from
            recorded = torch.tensor(r.logprobs)
            assert torch.allclose(logp[i, : len(recorded)], recorded, atol=1e-5, rtol=0)
        checks.append(len(rows))
        with torch.no_grad():  # an "update": later turns sample from new parameters
            for p in policy.model.parameters():
                p.add_(0.01 * torch.randn_like(p))

    learn = SpyLearn("node", after=check_then_update)
    ctx = context(policy, lambda: FrozenLakeEnv(max_turns=3), learn, max_new_tokens=8)
    exp = get_strategy("rtpo")(ctx, [LAKE], 3, prefix_cache=prefix_cache, skip_ties=False)
    assert checks == [2, 2, 2]
    trunk = {r.turn: r for r in exp.batch.records if r.traj_id == "s1-lake#0"}
    for call, k in zip(learn.calls, (2, 1, 0), strict=True):
        for r in call:
            if is_trained(r):
                assert r.prompt_ids == trunk[k].prompt_ids  # the trunk's exact context
    if prefix_cache:
        assert exp.extra["tokens_computed"] < exp.extra["tokens_all"]
        # the least possible: unique tokens, plus the trunk contexts re-encoded after updates
        minimum = exp.extra["tokens_unique"] + exp.extra["tokens_refresh"]
        assert 0.9 * minimum <= exp.extra["tokens_computed"] <= 1.1 * minimum


def test_turn_positions_where_all_siblings_tie_are_not_updated() -> None:
    # k=1 siblings tie (both right: no signal, skipped); k=0 siblings differ (one update)
    def script(ctx, call, row):
        if call == 0:
            return "<call>2+3</call>"
        if call in (1, 2):
            return "<answer>5</answer>"
        return ["<answer>5</answer>", "<answer>4</answer>"][row]

    learn = SpyLearn("node")
    ctx = context(ScriptedPolicy(script), CalculatorEnv, learn)
    exp = get_strategy("rtpo")(ctx, [CALC], 3)
    assert exp.extra["updates"] == 1 and exp.extra["updates_skipped"] == 1
    assert [r.turn for r in learn.trained(0)] == [0, 0]
    tied = [r for r in exp.batch.records if ".k1." in r.traj_id and r.turn == 1]
    assert len(tied) == 2  # logged, but never learned on (the rollout log gives them 0)
    assert not any((r.traj_id, r.turn) in learn.advantage for r in tied)


def test_refresh_is_counted_only_after_a_position_that_was_updated() -> None:
    # trunk: tool call, tool call, answer (3 turns). k=2: siblings differ (update, cache
    # cleared); k=1: siblings tie (skipped, cache still valid); k=0: siblings differ.
    def script(ctx, call, row):
        if call in (0, 1):
            return "<call>2+3</call>"
        if call in (2, 4):
            return "<answer>5</answer>"  # trunk's answer; k=1 siblings both right
        return ["<answer>5</answer>", "<answer>4</answer>"][row]

    learn = SpyLearn("node")
    ctx = context(ScriptedPolicy(script), CalculatorEnv, learn)
    exp = get_strategy("rtpo")(ctx, [CALC], 3)
    assert exp.extra["updates"] == 2 and exp.extra["updates_skipped"] == 1
    trunk = {r.turn: r for r in exp.batch.records if r.traj_id == "s1-calc#0"}
    assert sorted(trunk) == [0, 1, 2]
    # only the turn-1 context is re-encoded (after k=2's update); turn 0's is its prefix
    assert exp.extra["tokens_refresh"] == len(trunk[1].prompt_ids)


def test_after_a_skipped_position_the_trunk_context_is_not_encoded_again(monkeypatch) -> None:
    from turnrl.rollout import rtpo as rtpo_module

    signal = iter([True, False, True])  # k=2 updated, k=1 tied (skipped), k=0 updated
    monkeypatch.setattr(rtpo_module, "has_signal", lambda rows: next(signal))
    policy = build_tiny_policy(seed=3)
    computed: list[tuple[list[list[int]], int]] = []
    sample = policy.sample

    def spy_sample(contexts, *, prefix_cache=None, **kwargs):
        before = policy.tokens_computed
        out = sample(contexts, prefix_cache=prefix_cache, **kwargs)
        computed.append(([list(c) for c in contexts], policy.tokens_computed - before))
        return out

    policy.sample = spy_sample  # type: ignore[method-assign]
    learn = SpyLearn("node")
    ctx = context(policy, lambda: FrozenLakeEnv(max_turns=3), learn, max_new_tokens=8)
    exp = get_strategy("rtpo")(ctx, [LAKE], 3)
    assert exp.extra["updates"] == 2 and exp.extra["updates_skipped"] == 1
    trunk = {r.turn: r for r in exp.batch.records if r.traj_id == "s1-lake#0"}
    assert sorted(trunk) == [0, 1, 2]
    k1, k0 = (
        next(i for i, (c, _) in enumerate(computed) if c == [list(trunk[k].prompt_ids)] * 2)
        for k in (1, 0)
    )
    # k=1 comes right after an update: its trunk context is encoded again ...
    assert computed[k1][1] >= len(trunk[1].prompt_ids)
    # ... and k=0, after the skipped k=1, finds its context (a prefix of turn 1's) cached:
    # only the two siblings' sampled tokens are computed, at most 8 each.
    assert computed[k0][1] <= 2 * 8
    assert exp.extra["tokens_refresh"] == len(trunk[1].prompt_ids)
