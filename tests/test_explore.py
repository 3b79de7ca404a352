"""Persona-style exploration: hidden instructions in deployments, plain states in the logs."""

from __future__ import annotations

import pytest
import torch

from turnrl.envs import make_env, make_tasks
from turnrl.policy import build_tiny_policy
from turnrl.table import TurnTable
from turnrl.train.iterate.config import DeployConfig
from turnrl.train.iterate.deploy import deploy, deployment_arms
from turnrl.train.iterate.explore import PersonaEnv, with_instruction
from turnrl.types import TurnRecord

torch.set_num_threads(1)


def test_with_instruction_appends_to_the_system_message() -> None:
    messages = [{"role": "system", "content": "Sell."}, {"role": "user", "content": "50?"}]
    assert with_instruction(messages, "Be bold.") == [
        {"role": "system", "content": "Sell.\nBe bold."},
        {"role": "user", "content": "50?"},
    ]
    assert messages[0]["content"] == "Sell."  # the input is not changed
    assert with_instruction([{"role": "user", "content": "hi"}], "Be bold.") == [
        {"role": "system", "content": "Be bold."},
        {"role": "user", "content": "hi"},
    ]
    with pytest.raises(ValueError, match="non-empty"):
        PersonaEnv(make_env("haggle"), "  ")


def test_deployment_arms_split_over_temperatures_and_personas() -> None:
    cfg = DeployConfig(conversations_per_task=5, temperatures=[1.0, 1.5], personas=["", "x"])
    assert deployment_arms(cfg) == [(1.0, 0, 2), (1.0, 1, 1), (1.5, 0, 1), (1.5, 1, 1)]
    assert deployment_arms(DeployConfig(conversations_per_task=4)) == [(1.0, 0, 4)]
    with pytest.raises(ValueError, match="personas"):
        deployment_arms(DeployConfig(personas=[]))


def test_the_policy_sees_the_persona_and_the_logs_do_not() -> None:
    policy = build_tiny_policy(seed=0, hidden=16, layers=1)
    tasks = make_tasks("haggle", 2, seed=0)
    instruction = "Open high."
    seen: list[list[int]] = []
    sample = policy.sample

    def spy(contexts, **kwargs):
        seen.extend(list(c) for c in contexts)
        return sample(contexts, **kwargs)

    policy.sample = spy  # type: ignore[method-assign]
    cfg = DeployConfig(conversations_per_task=2, personas=["", instruction])
    batch = deploy(
        policy, lambda: make_env("haggle"), tasks, cfg, max_new_tokens=8, seed=0, prefix="i1-"
    )
    plain = {t.task_id: policy.encode_initial(make_env("haggle").reset(t)) for t in tasks}
    instructed = {
        t.task_id: policy.encode_initial(with_instruction(make_env("haggle").reset(t), instruction))
        for t in tasks
    }
    assert {r.persona for r in batch.records} == {0, 1}
    for record in batch.records:  # every logged state starts with the plain opening
        opening = plain[record.task_id]
        assert list(record.prompt_ids[: len(opening)]) == opening
    # the persona conversations were sampled from the instructed openings
    for task_id, opening in instructed.items():
        assert sum(c[: len(opening)] == opening for c in seen) >= 1, task_id
    # each persona conversation's logged turn 0 is exactly the plain opening
    first = [r for r in batch.records if r.persona == 1 and r.turn == 0]
    assert len(first) == 2 and all(list(r.prompt_ids) == plain[r.task_id] for r in first)
    # contexts still grow by appending: turn t+1 extends turn t's context and response
    by_turn = {(r.traj_id, r.turn): r for r in batch.records}
    for (traj, turn), record in by_turn.items():
        if (traj, turn + 1) in by_turn:
            grown = record.prompt_ids + record.response_ids
            assert by_turn[traj, turn + 1].prompt_ids[: len(grown)] == grown
    assert TurnTable.from_records(batch.records, source="deploy").n_rows == len(batch.records)


def test_persona_styles_add_instructed_demonstrations(tmp_path) -> None:
    from turnrl.envs import demonstration
    from turnrl.train.config import load_config
    from turnrl.train.iterate.config import IterateConfig
    from turnrl.train.iterate.loop import IterativeGRPO
    from turnrl.train.iterate.warm_start import warm_start_examples

    overrides = [
        "env.name=haggle",
        "env.n_train_tasks=3",
        "deploy.tasks_per_iteration=2",
        "env.n_eval_tasks=1",
        "policy.hidden=16",
        "policy.layers=1",
        f"run_dir={tmp_path}",
    ]
    plain = IterativeGRPO(load_config(IterateConfig, None, overrides), quiet=True)
    styled = IterativeGRPO(
        load_config(
            IterateConfig, None, [*overrides, 'warm_start.persona_styles={ "Be hard." = "strong" }']
        ),
        quiet=True,
    )
    base = warm_start_examples(plain.policy, plain.config, plain.train_tasks, None)
    both = warm_start_examples(styled.policy, styled.config, styled.train_tasks, None)
    extra = both[len(base) :]
    assert [e.context for e in both[: len(base)]] == [e.context for e in base]
    strong = [
        m["content"]
        for task in styled.train_tasks
        for m in demonstration("haggle", task, style="strong", max_turns=6)
        if m["role"] == "assistant"
    ]
    policy = styled.policy
    assert len(extra) == len(strong)
    assert all(e.response[-1] == policy.eos_token_id for e in extra)
    assert [policy.decode(e.response[:-1]) for e in extra] == strong
    instructed = policy.encode_initial(
        with_instruction(styled._make_env().reset(styled.train_tasks[0]), "Be hard.")
    )
    assert extra[0].context == instructed
    bad = load_config(
        IterateConfig,
        None,
        [*overrides, "env.name=calculator", 'warm_start.persona_styles={ "x" = "strong" }'],
    )
    with pytest.raises(ValueError, match="negotiation"):
        IterativeGRPO(bad, quiet=True)._warm_start_examples(None)


def test_hide_personas_refuses_contexts_built_another_way() -> None:
    from turnrl.rollout import RolloutBatch
    from turnrl.rollout.runner import Episode
    from turnrl.train.iterate.explore import hide_personas

    policy = build_tiny_policy(seed=0, hidden=16, layers=1)
    task = make_tasks("haggle", 1, seed=0)[0]
    env = PersonaEnv(make_env("haggle"), "Open high.")
    env.reset(task)
    episode = Episode(task, "x", env, [])
    record = TurnRecord(task_id=task.task_id, traj_id="x", turn=0, prompt_ids=[1, 2, 3])
    with pytest.raises(ValueError, match="x turn 0: prompt_ids do not start"):
        hide_personas(policy, RolloutBatch(records=[record], episodes=[episode]), 1)


def test_persona_env_snapshots_keep_both_openings() -> None:
    tasks = make_tasks("haggle", 2, seed=0)
    env = PersonaEnv(make_env("haggle"), "Open high.")
    env.reset(tasks[0])
    saved = env.snapshot()
    openings = (env.plain_messages, env.instructed_messages)
    env.reset(tasks[1])
    other = env.step("<offer>100</offer>")
    fresh = PersonaEnv(make_env("haggle"), "Open high.")
    fresh.restore(saved)  # a branch restored into another PersonaEnv
    assert (fresh.plain_messages, fresh.instructed_messages) == openings
    env.restore(saved)
    assert env.step("<offer>100</offer>") == fresh.step("<offer>100</offer>") != other


def test_bad_exploration_settings_are_refused_up_front(tmp_path) -> None:
    from turnrl.train.config import load_config
    from turnrl.train.iterate.config import IterateConfig
    from turnrl.train.iterate.loop import IterativeGRPO

    base = ["env.n_train_tasks=16", f"run_dir={tmp_path / 'run'}"]
    bad_style = load_config(
        IterateConfig, None, [*base, 'warm_start.persona_styles={ "Be hard." = "fierce" }']
    )
    with pytest.raises(ValueError, match=r"warm_start.persona_styles\['Be hard.'\]: unknown style"):
        IterativeGRPO(bad_style, quiet=True)
    with pytest.raises(ValueError, match=r"deploy\.personas"):
        IterativeGRPO(load_config(IterateConfig, None, [*base, "deploy.personas=[]"]), quiet=True)
    with pytest.raises(ValueError, match=r"improve\.std_floor: must be >= 0"):
        IterativeGRPO(load_config(IterateConfig, None, [*base, "improve.std_floor=-1"]), quiet=True)
    assert not (tmp_path / "run").exists()  # nothing written
