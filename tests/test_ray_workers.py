"""Ray rollout workers: same batch as the in-process runner, versioned weights, and a
worker killed mid-batch loses nothing (local Ray with 2 CPUs; skipped without Ray)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import REPO
from turnrl.envs import make_env, make_tasks
from turnrl.integrations.ray_workers import RayRolloutPool, shard, train_with_workers
from turnrl.policy import build_tiny_policy
from turnrl.rollout import run_episodes
from turnrl.rollout.runner import (
    RolloutBatch,
    continue_episodes,
    episode_seed,
    plan_episodes,
    start_episode,
)
from turnrl.train.config import RunConfig, load_config
from turnrl.train.online.trainer import OnlineTrainer

torch.set_num_threads(1)

ENV = "calculator"
TINY_RUN = [
    "warm_start.steps=2",
    "warm_start.batch_size=4",
    "env.n_train_tasks=8",
    "env.n_eval_tasks=2",
    "rollout.group_size=2",
    "rollout.tasks_per_step=2",
    "rollout.workers=2",
    "policy.max_new_tokens=8",
    "train.steps=2",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    "train.minibatch_size=8",
    "train.threads=1",
    "train.log_rollouts_every=1",
]
ROLLOUT = {"group_size": 2, "max_new_tokens": 16, "temperature": 1.0, "traj_prefix": "s1-"}


def calculator() -> object:
    return make_env(ENV)


def tasks() -> list:
    return make_tasks(ENV, 3, seed=1)


def in_process(policy, seed: int) -> RolloutBatch:
    return run_episodes(policy, calculator, tasks(), seed=seed, per_episode_seeds=True, **ROLLOUT)


def assert_same_batch(got: RolloutBatch, want: RolloutBatch, *, exact: bool) -> None:
    """Same episodes, records and order; tokens exact, log-probs exact or to 1e-4."""
    assert [e.traj_id for e in got.episodes] == [e.traj_id for e in want.episodes]
    assert [(e.turn, e.outcome, e.end) for e in got.episodes] == [
        (e.turn, e.outcome, e.end) for e in want.episodes
    ]
    assert len(got.records) == len(want.records)
    for a, b in zip(got.records, want.records, strict=True):
        a = dataclasses.replace(a, policy_version=None)
        b = dataclasses.replace(b, policy_version=None)
        if exact:
            assert a == b
        else:
            assert dataclasses.replace(a, logprobs=None) == dataclasses.replace(b, logprobs=None)
            assert a.logprobs == pytest.approx(b.logprobs, rel=1e-4, abs=1e-4)
    assert got.sampled_tokens == want.sampled_tokens


# ----------------------------------------------------------- no Ray needed
def test_per_episode_seeds_do_not_depend_on_batch_mates() -> None:
    """Episode k run in a sub-batch (as on a worker) draws the tokens it draws in the full batch."""
    policy = build_tiny_policy(0)
    full = in_process(policy, seed=5)
    plan = list(enumerate(plan_episodes(tasks(), 2, "s1-")))
    part = [start_episode(policy, calculator, t, traj, episode_seed(5, k)) for k, (t, traj) in plan]
    some = continue_episodes(policy, part[1:4], max_new_tokens=16, temperature=1.0, seed=0)
    wanted = {e.traj_id for e in part[1:4]}

    def responses(batch: RolloutBatch) -> dict[str, list[list[int]]]:
        out: dict[str, list[list[int]]] = {}
        for record in batch.records:
            if record.traj_id in wanted:
                out.setdefault(record.traj_id, []).append(record.response_ids)
        return out

    assert len(wanted) == 3 and responses(some) == responses(full)


def test_per_row_seed_count_must_match() -> None:
    policy = build_tiny_policy(0)
    context = policy.encode_initial([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="2 per-row seeds for 1 contexts"):
        policy.sample([context], max_new_tokens=2, seed=[1, 2])


@given(n=st.integers(0, 30), workers=st.integers(1, 5), per_call=st.none() | st.integers(1, 7))
def test_shards_cover_the_batch_in_order(n: int, workers: int, per_call: int | None) -> None:
    plan = [(k, None, f"t#{k}") for k in range(n)]
    chunks = shard(plan, workers, per_call)
    assert [e for chunk in chunks for e in chunk] == plan
    assert all(0 < len(c) <= (per_call or -(-n // workers)) for c in chunks)
    if per_call is None:
        assert len(chunks) <= workers


def test_the_pool_takes_run_episodes_options() -> None:
    """``RayRolloutPool.run`` takes ``run_episodes``' keyword options (same names and
    defaults, less ``per_episode_seeds``), so the pool's ``run_episodes`` forwards them."""

    def keywords(fn) -> dict[str, object]:
        parameters = inspect.signature(fn).parameters.values()
        return {p.name: p.default for p in parameters if p.kind is p.KEYWORD_ONLY}

    expected = keywords(run_episodes)
    del expected["per_episode_seeds"]
    assert keywords(RayRolloutPool.run) == expected


def run_config(run_dir: Path) -> RunConfig:
    return load_config(
        RunConfig, REPO / "examples" / "calculator.toml", [*TINY_RUN, f"run_dir={run_dir}"]
    )


def logged_versions(run_dir: Path, step: int) -> set[int]:
    lines = (run_dir / "rollouts" / f"step-{step:06d}.jsonl").read_text().splitlines()
    return {json.loads(line)["policy_version"] for line in lines}


class InProcessPool:
    """A ``RolloutPool`` without Ray: its own policy copy, loaded from every push."""

    def __init__(self) -> None:
        self.policy = build_tiny_policy(1)
        self.pushes: list[int] = []

    def push_weights(self, state_dict, version: int) -> None:
        self.policy.load_state_dict(state_dict)
        self.pushes.append(version)

    def run_episodes(self, policy, make_env, tasks, **kwargs) -> RolloutBatch:
        batch = run_episodes(self.policy, make_env, tasks, per_episode_seeds=True, **kwargs)
        batch.records = [
            dataclasses.replace(r, policy_version=self.pushes[-1]) for r in batch.records
        ]
        return batch


def test_trainer_pushes_weights_to_its_pool_after_every_update(tmp_path: Path) -> None:
    config = run_config(tmp_path)
    with pytest.raises(ValueError, match="rollout pool"):
        OnlineTrainer(config, quiet=True)
    pool = InProcessPool()
    trainer = OnlineTrainer(config, quiet=True, pool=pool)
    trainer.run()
    assert pool.pushes == [0, 1, 2]  # the warm start, then one per update
    trained = trainer.policy.state_dict()
    held = pool.policy.state_dict()
    assert all(torch.equal(trained[k], held[k]) for k in trained)
    assert logged_versions(tmp_path, 1) == {0} and logged_versions(tmp_path, 2) == {1}


# ---------------------------------------------------------------- with Ray
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'turnrl[ray]')")


class CrashingPolicy:
    """The tiny policy, but the worker process exits on its 2nd ``sample`` call after
    ``arm`` appears; the first worker to get there claims (deletes) ``arm``, so exactly
    one worker dies, in the middle of an episode."""

    def __init__(self, arm: str) -> None:
        self.inner = build_tiny_policy(0)
        self.arm = arm
        self.seen = 0

    @classmethod
    def build(cls, arm: str) -> CrashingPolicy:
        return cls(arm)

    def __getattr__(self, name: str):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def sample(self, contexts, **kwargs):
        if os.path.exists(self.arm):
            self.seen += 1
            if self.seen == 2:
                try:
                    os.remove(self.arm)
                except FileNotFoundError:
                    pass  # another worker claimed it
                else:
                    os._exit(1)
        return self.inner.sample(contexts, **kwargs)


@pytest.fixture(scope="module")
def arm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ray") / "arm"


@pytest.fixture(scope="module")
def pool(arm: Path):
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    # Workers cannot import this test module: send CrashingPolicy by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # 0-CPU actors leave the 2 CPUs to the pool that train_with_workers starts.
    pool = RayRolloutPool(
        partial(CrashingPolicy.build, str(arm)), ENV, workers=2, actor_options={"num_cpus": 0}
    )
    yield pool
    pool.close()
    ray.shutdown()


def next_version(pool: RayRolloutPool) -> int:
    return (pool.version or 0) + 1


def test_run_needs_pushed_weights(pool: RayRolloutPool) -> None:
    fresh = RayRolloutPool(partial(build_tiny_policy, 0), ENV, workers=1)
    try:
        with pytest.raises(RuntimeError, match="push_weights"):
            fresh.run(tasks(), seed=5, **ROLLOUT)
    finally:
        fresh.close()


def test_pool_equals_the_in_process_runner(pool: RayRolloutPool) -> None:
    policy = build_tiny_policy(0)
    version = next_version(pool)
    pool.push_weights(policy.state_dict(), version)
    got = pool.run(tasks(), seed=5, **ROLLOUT)
    assert_same_batch(got, in_process(policy, seed=5), exact=False)
    assert {r.policy_version for r in got.records} == {version}
    assert got.extra["policy_version"] == version and got.extra["worker_restarts"] == 0


def test_pushed_weights_are_used_and_versions_increase(pool: RayRolloutPool) -> None:
    policy = build_tiny_policy(0)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
    version = next_version(pool)
    pool.push_weights(policy.state_dict(), version)
    got = pool.run(tasks(), seed=6, **ROLLOUT)
    assert_same_batch(got, in_process(policy, seed=6), exact=False)
    assert {r.policy_version for r in got.records} == {version}
    with pytest.raises(ValueError, match="must be greater"):
        pool.push_weights(policy.state_dict(), version)


def test_a_worker_killed_mid_batch_loses_nothing(pool: RayRolloutPool, arm: Path) -> None:
    policy = build_tiny_policy(0)
    pool.push_weights(policy.state_dict(), next_version(pool))
    pool.episodes_per_call = 2  # 3 chunks: worker 0 runs chunks 0 and 2, worker 1 chunk 1
    try:
        clean = pool.run(tasks(), seed=7, **ROLLOUT)
        assert clean.extra["worker_restarts"] == 0
        arm.touch()
        crashed = pool.run(tasks(), seed=7, **ROLLOUT)
        assert not arm.exists()  # a worker did die
        assert crashed.extra["worker_restarts"] == 1
        assert_same_batch(crashed, clean, exact=True)  # same chunks: bit-identical
    finally:
        pool.episodes_per_call = None
    assert_same_batch(clean, in_process(policy, seed=7), exact=False)
    trajs = [r.traj_id for r in crashed.records if r.turn == 0]
    assert len(trajs) == len(set(trajs)) == 6  # every episode once


class OffsetVersions:
    """The module's Ray pool serving one more trainer: trainer version ``v`` is pushed as
    ``offset + v`` (a pool's versions only increase, and earlier tests pushed some)."""

    def __init__(self, pool: RayRolloutPool) -> None:
        self.pool = pool
        self.offset = next_version(pool)

    def push_weights(self, state_dict, version: int) -> None:
        self.pool.push_weights(state_dict, self.offset + version)

    def run_episodes(self, *args, **kwargs) -> RolloutBatch:
        return self.pool.run_episodes(*args, **kwargs)


def metric_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_metrics_record_workers_restarts_and_policy_version(pool, tmp_path: Path) -> None:
    """A training run on Ray workers logs, per step, what the pool reported."""
    served = OffsetVersions(pool)
    OnlineTrainer(run_config(tmp_path), quiet=True, pool=served).run()
    rows = metric_rows(tmp_path)
    assert "workers" not in rows[0]  # step 0 is the warm start's evaluation only
    assert [
        (r["step"], r["workers"], r["worker_restarts"], r["policy_version"]) for r in rows[1:]
    ] == [
        (1, 2, 0, served.offset),
        (2, 2, 0, served.offset + 1),
    ]


@pytest.mark.slow
def test_a_worker_killed_between_batches_is_replaced(pool: RayRolloutPool) -> None:
    policy = build_tiny_policy(0)
    pool.push_weights(policy.state_dict(), next_version(pool))
    clean = pool.run(tasks(), seed=8, **ROLLOUT)
    dead = pool.actor(1)
    ray.kill(dead)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(dead.pid.remote(), timeout=60)
    again = pool.run(tasks(), seed=8, **ROLLOUT)
    assert again.extra["worker_restarts"] == 1
    assert_same_batch(again, clean, exact=True)


@pytest.mark.slow
def test_training_with_ray_workers(pool: RayRolloutPool, tmp_path: Path) -> None:
    run_dir = train_with_workers(run_config(tmp_path), quiet=True)
    assert logged_versions(run_dir, 1) == {0} and logged_versions(run_dir, 2) == {1}
    steps = metric_rows(run_dir)[1:]
    assert [(r["workers"], r["worker_restarts"], r["policy_version"]) for r in steps] == [
        (2, 0, 0),
        (2, 0, 1),
    ]


def test_workers_that_cannot_start_are_a_clear_error(pool: RayRolloutPool) -> None:
    greedy = RayRolloutPool(
        partial(build_tiny_policy, 0),
        ENV,
        workers=1,
        actor_options={"num_cpus": 64},
        load_timeout_s=1.0,
    )
    try:
        with pytest.raises(RuntimeError, match="does the Ray cluster have room"):
            greedy.push_weights(build_tiny_policy(0).state_dict(), 0)
    finally:
        greedy.close()
