"""The learner over torchrun ranks (gloo on CPU, 2 ranks): it equals one process.

The runs are real ``torchrun`` launches (``python -m torch.distributed.run``) of the
CLI on the ``parity`` environment (tests/distributed_entry.py registers it), a few
seconds of training each. The reference is one process with the same config:
``rollout.per_episode_seeds = true`` (which ranks require), so both sample the same
episodes; without the flag one process samples differently (today's default,
unchanged, checked by the other test files).

Tolerance. Tokens, rewards and advantages are the same; sampling log-probs differ by
float rounding (a rank's batch is smaller, so padding and summation order differ)
and gradients are summed in another order. After 3 steps (2 epochs of mini-batches
each) every weight agrees within ``WEIGHT_ATOL = 1e-5`` (measured: under 1e-6 on
weights of order 1) and every float metric within a relative ``METRIC_RTOL = 1e-5``.
A 2-rank run resumed with 2 ranks from its step-2 checkpoint (as a crash leaves the
run directory) equals the uninterrupted one exactly.

Metrics that count what each process ran (:data:`SPLIT_DEPENDENT`) differ by design:
prefixes shared by tasks on different ranks are computed once per rank.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import PARITY, REPO
from launched import rank_processes, run_launcher, stop_launcher
from turnrl.errors import UsageError
from turnrl.train.checkpoint import load_latest_checkpoint
from turnrl.train.config import RunConfig, load_config
from turnrl.train.distributed import World, owned_slice, world_from_env
from turnrl.train.online.ranks import check_supported
from turnrl.train.update.loss import AGGREGATIONS, aggregation_weights

WEIGHT_ATOL = 1e-5
METRIC_RTOL = 1e-5
SPLIT_DEPENDENT = frozenset(
    {"update_activation_mib", "update_tokens_computed", "tokens_computed", "computed_over_unique"}
)
"""Metrics of the work each process did (activation memory, positions computed)."""

ENTRY = REPO / "tests" / "distributed_entry.py"
RECIPE = REPO / "examples" / "calculator.toml"
RUN = (
    *PARITY,
    "env.n_train_tasks=16",
    "env.n_eval_tasks=2",
    "rollout.group_size=4",
    "rollout.tasks_per_step=4",
    "rollout.per_episode_seeds=true",
    "policy.hidden=32",
    "policy.layers=1",
    "policy.max_new_tokens=8",
    "train.steps=3",
    "train.eval_every=2",
    "train.eval_samples=1",
    "train.checkpoint_every=1",
    "train.keep_checkpoints=3",
    "train.minibatch_size=6",
    "train.epochs=2",
    "train.threads=1",
    "train.log_rollouts_every=0",
)
"""3 steps of 4 parity tasks x 4 episodes: each of 2 ranks samples and learns 2 tasks."""

LAYOUTS = {
    "tree-full": ("train.update=tree",),
    "rows-full-kl": ("train.update=rows", "train.aggregation=rollout-mean", "train.kl_coef=0.05"),
    "tree-lora": ("train.update=tree", "policy.lora_rank=4", "train.lr=3e-3"),
}


# --------------------------------------------------------------------------- launching


def command(run_dir: Path, ranks: int, *extra: str, resume: bool = False) -> list[str]:
    """The CLI on ``ranks`` torchrun ranks (0: a plain process)."""
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
        if ranks
        else [sys.executable]
    )
    return [
        *launcher,
        str(ENTRY),
        "train",
        "--config",
        str(RECIPE),
        *RUN,
        *extra,
        "--run-dir",
        str(run_dir),
        "--quiet",
        *(["--resume"] if resume else []),
    ]


def environment() -> dict[str, str]:
    src = str(REPO / "src")
    path = os.environ.get("PYTHONPATH", "")
    return {
        **os.environ,
        "PYTHONPATH": f"{src}{os.pathsep}{path}" if path else src,
        "OMP_NUM_THREADS": "1",
        # a rank that aborts (SIGABRT, SIGSEGV) prints every thread's Python stack, so a
        # failure here says where it happened
        "PYTHONFAULTHANDLER": "1",
    }


def train(run_dir: Path, ranks: int, *extra: str, resume: bool = False) -> None:
    done = run_launcher(
        command(run_dir, ranks, *extra, resume=resume), env=environment(), timeout=300
    )
    assert done.returncode == 0, done.stderr[-6000:]


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / f"step-{step:06d}.pt", weights_only=False)["model"]


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("seconds_")} for r in rows]


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def assert_metrics_close(
    a: list[dict[str, Any]], b: list[dict[str, Any]], rtol: float = METRIC_RTOL
) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for row_a, row_b in zip(a, b, strict=True):
        assert row_a.keys() == row_b.keys()
        for key, value in row_a.items():
            if key in SPLIT_DEPENDENT:
                continue
            if isinstance(value, float):
                assert row_b[key] == pytest.approx(value, rel=rtol, abs=1e-7, nan_ok=True), key
            else:
                assert row_b[key] == value, key


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run directories made once for the module, by name (``{layout}-{ranks}``)."""
    root = tmp_path_factory.mktemp("distributed")

    class Runs(dict):
        def __missing__(self, name: str) -> Path:
            layout, ranks = name.rsplit("-", 1)
            run_dir = root / name
            train(run_dir, int(ranks), *LAYOUTS[layout])
            self[name] = run_dir
            return run_dir

    return Runs()


# --------------------------------------------------------------------------- 2 ranks = 1


FAST_LAYOUT = "rows-full-kl"
"""The layout of ``make test`` (#38: ``make test`` within 20 minutes); the others are in
``make test-slow`` only, see :func:`test_two_ranks_equal_one_process`."""


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param(layout, marks=[] if layout == FAST_LAYOUT else [pytest.mark.slow])
        for layout in sorted(LAYOUTS)
    ],
)
def test_two_ranks_equal_one_process(runs: dict[str, Path], layout: str) -> None:
    """``rows-full-kl`` runs in ``make test``; ``tree-full`` and ``tree-lora`` in ``make
    test-slow`` only (#38: about 80 s each). ``make test`` covers them in parts: the tree
    update split over 2 ranks equals one process in tests/test_distributed_fsdp.py's
    ``test_fsdp2_ranks_equal_one_process[tree-pad]`` (sharded; both ranks sample their
    own tasks as here), and the gradient sum over ranks of any parameter list, LoRA's
    (frozen base weights without gradients) included, in
    ``test_collectives_on_two_gloo_ranks`` (``nobody``: a parameter no rank has a
    gradient for stays without one)."""
    one, two = runs[f"{layout}-0"], runs[f"{layout}-2"]
    for step in (1, 2, 3):
        assert max_difference(weights(one, step), weights(two, step)) <= WEIGHT_ATOL, step
    # the comparison is not vacuous: the last step moved the weights far beyond it
    assert max_difference(weights(two, 2), weights(two, 3)) > 100 * WEIGHT_ATOL
    rows = metrics(two)
    assert all(r["grad_norm"] > 0 for r in rows[1:])
    assert [r["episodes"] for r in rows[1:]] == [16, 16, 16]
    assert_metrics_close(metrics(one), rows)
    # rank 0 alone wrote: one metrics line per step, one report, three checkpoints
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert (two / "report.html").is_file()


def crashed_after(whole: Path, step: int, copy: Path) -> Path:
    """A copy of the finished run ``whole`` as a crash right after its checkpoint of
    ``step`` leaves it: the later checkpoints and rollout logs are gone and ``latest``
    names that checkpoint (the metrics log keeps its later lines: ``--resume`` cuts it
    back to the checkpoint's step). Resuming it redoes the later steps, as a run stopped
    there would, without a launch that trains the first steps again."""
    shutil.copytree(whole, copy)
    checkpoints = copy / "checkpoints"
    for path in [*checkpoints.glob("step-*.pt"), *copy.glob("rollouts/step-*.jsonl")]:
        if int(path.name.split(".")[0].removeprefix("step-")) > step:
            path.unlink()
    (checkpoints / "latest").write_text(f"step-{step:06d}.pt")
    assert load_latest_checkpoint(copy)["step"] == step
    return copy


def test_resumed_two_rank_run_equals_uninterrupted(runs: dict[str, Path], tmp_path: Path) -> None:
    whole = runs[f"{FAST_LAYOUT}-2"]
    cut = crashed_after(whole, 2, tmp_path / "cut")
    train(cut, 2, *LAYOUTS[FAST_LAYOUT], resume=True)
    assert metrics(cut) == metrics(whole)
    assert max_difference(weights(cut, 3), weights(whole, 3)) == 0.0


@pytest.mark.slow
def test_two_rank_run_resumes_as_one_process(runs: dict[str, Path], tmp_path: Path) -> None:
    """Any rank count that divides the batch resumes a run: here one process.

    In ``make test-slow`` only (#38: one launch more). ``make test`` covers it in two
    halves: a 2-rank checkpoint resumes to the uninterrupted numbers
    (``test_resumed_two_rank_run_equals_uninterrupted``), and 2 ranks and one process
    hold the same weights and metrics after each step
    (``test_two_ranks_equal_one_process``), so what one process restores is the state
    it would have reached itself."""
    whole = runs[f"{FAST_LAYOUT}-2"]
    other = crashed_after(whole, 2, tmp_path / "other")
    train(other, 0, *LAYOUTS[FAST_LAYOUT], resume=True)
    assert max_difference(weights(other, 3), weights(whole, 3)) <= WEIGHT_ATOL
    assert_metrics_close(metrics(other), metrics(whole))


# --------------------------------------------------------------------------- failures


ASYNC = (
    *LAYOUTS[FAST_LAYOUT],
    "train.max_staleness=1",
    "train.tis_cap=2.0",
    "train.checkpoint_every=3",
    "train.log_rollouts_every=1",
)
"""K = 1, no checkpoint before the last step: steps 2 and 3 sample one version behind."""


def test_two_asynchronous_ranks_equal_one_asynchronous_process(tmp_path: Path) -> None:
    """``train.max_staleness = 1`` under torchrun (#37): each rank's sampler process
    samples the rank's share of the next step while the ranks update. The run equals
    one process at K = 1 (both with per-episode seeds): the same episodes, token for
    token, sampled with the same versions, the same metrics (the per-turn correction's
    ``mismatch_*`` and ``tis_corrected_frac`` are the global batch's on both), and
    weights within ``WEIGHT_ATOL``."""
    one, two = tmp_path / "one", tmp_path / "two"
    train(one, 0, *ASYNC)
    train(two, 2, *ASYNC)
    rows = metrics(two)
    assert [r["policy_version"] for r in rows[1:]] == [0, 0, 1]
    assert [r["staleness_max"] for r in rows[1:]] == [0.0, 1.0, 1.0]
    assert all(r["grad_norm"] > 0 for r in rows[1:])
    assert [r["episodes"] for r in rows[1:]] == [16, 16, 16]
    alone = metrics(one)
    for row_one, row_two in zip(alone, rows, strict=True):
        # the learner's recomputation for the per-turn correction runs on each rank's
        # rows: its gap to the sampler's log-probs (about 1e-7) differs in float noise
        for key in [k for k in row_one if k.startswith("mismatch_")]:
            assert row_two.pop(key) == pytest.approx(row_one.pop(key), abs=1e-6), key
    assert_metrics_close(alone, rows)
    for step in (1, 2, 3):
        path = Path("rollouts") / f"step-{step:06d}.jsonl"
        alone_records, rank_records = (
            [json.loads(line) for line in (run / path).read_text().splitlines()]
            for run in (one, two)
        )
        assert len(alone_records) == len(rank_records) > 0
        for a, b in zip(alone_records, rank_records, strict=True):
            # log-probs from batches of 16 episodes against 8: float noise (about 5e-7)
            assert b.pop("logprobs") == pytest.approx(a.pop("logprobs"), abs=1e-5)
            assert a == b, step  # every token, reward, version and advantage
    assert max_difference(weights(one, 3), weights(two, 3)) <= WEIGHT_ATOL


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds ranks through /proc")
def test_killed_rank_ends_the_run_with_one_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "killed"
    process = subprocess.Popen(
        command(run_dir, 2, "train.steps=200", "train.eval_every=0"),
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "checkpoints" / "step-000002.pt").exists():
            assert process.poll() is None, process.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            time.sleep(0.2)
        ranks = rank_processes(process.pid)
        assert sorted(ranks) == [0, 1]
        os.kill(ranks[1], signal.SIGKILL)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            stop_launcher(process)
    assert process.returncode != 0
    ours = [line for line in stderr.splitlines() if line.startswith("turnrl train: error:")]
    assert len(ours) == 1, stderr[-3000:]
    assert ours[0].startswith("turnrl train: error: rank 0:")
    assert "--resume" in ours[0]
    # nothing half-written: every checkpoint file loads, the metrics log parses
    checkpoints = run_dir / "checkpoints"
    for path in checkpoints.glob("step-*.pt"):
        torch.load(path, weights_only=False)
    latest = load_latest_checkpoint(run_dir)
    assert latest is not None and latest["step"] >= 2
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(len(rows)))


# --------------------------------------------------------------------------- pieces


def test_world_from_env() -> None:
    assert world_from_env({}) == World(0, 1, 0)
    world = world_from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert world == World(3, 4, 1) and world.split and not world.main
    with pytest.raises(UsageError, match="LOCAL_RANK missing"):
        world_from_env({"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(UsageError, match="out of range"):
        world_from_env({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    with pytest.raises(UsageError, match="not integers"):
        world_from_env({"RANK": "a", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})


def test_owned_slice() -> None:
    assert [owned_slice(8, World(r, 4, r)) for r in range(4)] == [
        slice(0, 2),
        slice(2, 4),
        slice(4, 6),
        slice(6, 8),
    ]
    assert owned_slice(8, World()) == slice(0, 8)
    with pytest.raises(UsageError, match="tasks_per_step = 6 is not a multiple of the 4"):
        owned_slice(6, World(0, 4, 0))


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 5), min_size=2, max_size=10),
    cut=st.integers(1, 9),
    mode=st.sampled_from(sorted(AGGREGATIONS)),
    data=st.data(),
)
def test_weights_of_a_share_are_the_global_batch_slice(
    lengths: list[int], cut: int, mode: str, data: Any
) -> None:
    """Each share's weights with the summed normaliser are its rows of the whole batch's
    weights (rollouts are contiguous and never cut, as whole tasks per rank)."""
    cut = min(cut, len(lengths) - 1)
    steps = st.lists(st.booleans(), min_size=len(lengths) - 1, max_size=len(lengths) - 1)
    rollout = np.cumsum([0, *data.draw(steps)])
    rollout[cut:] += 1000  # shares hold disjoint rollouts
    width = max(max(lengths), 1)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
    rollout_t = torch.as_tensor(rollout)
    whole = aggregation_weights(mask, mode, rollout_t)
    halves = [(slice(0, cut)), slice(cut, len(lengths))]

    def local_count(part: slice) -> torch.Tensor:
        m = mask[part].to(torch.float64)
        if mode == "token-mean":
            return m.sum()
        if mode == "seq-mean-token-mean":
            return (m.sum(1) > 0).sum()
        tokens: dict[int, float] = {}
        for r, n in zip(rollout[part].tolist(), m.sum(1).tolist(), strict=True):
            tokens[r] = tokens.get(r, 0.0) + n
        return torch.tensor(sum(1 for v in tokens.values() if v > 0))

    total = sum(local_count(h) for h in halves)
    for half in halves:
        share = aggregation_weights(
            mask[half], mode, rollout_t[half], reduce_count=lambda count, t=total: t.to(count)
        )
        torch.testing.assert_close(share, whole[half], rtol=1e-6, atol=0)


def test_unsupported_modes_are_refused_in_one_line(tmp_path: Path) -> None:
    def config(*extra: str) -> RunConfig:
        return load_config(RunConfig, RECIPE, [*RUN, f"run_dir={tmp_path}", *extra])

    two = World(0, 2, 0)
    check_supported(config(), two)
    cases = {
        "rollout.per_episode_seeds=false": "set rollout.per_episode_seeds = true",
        "rollout.tasks_per_step=3": "tasks_per_step = 3 is not a multiple of the 2",
    }
    for override, message in cases.items():
        with pytest.raises(UsageError, match=message):
            check_supported(config(override), two)
    # an [agent] run cannot be loaded from an [env] recipe (one mode per run): built in code
    agent_run = dataclasses.replace(
        config(), agent=dataclasses.replace(config().agent, entrypoint="agents/a.py:run")
    )
    with pytest.raises(UsageError, match=r"\[agent\]\) runs over ranks as turnrl.train.agent"):
        check_supported(agent_run, two)
    check_supported(config("rollout.workers=2"), two)  # rank 0 drives the pool
    with pytest.raises(UsageError, match="'patr' does not run under torchrun"):
        check_supported(config("rollout.strategy=patr", "rollout.per_episode_seeds=false"), two)


def test_collectives_on_two_gloo_ranks(tmp_path: Path) -> None:
    from distributed_collectives import collectives_worker

    torch.multiprocessing.spawn(
        collectives_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True
    )
    for rank in (0, 1):
        seen = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert seen["both"].tolist() == [3.0, 3.0, 3.0]  # summed, not averaged
        assert seen["only_rank0"].tolist() == [1.0, 2.0, 3.0]  # rank 1 added zeros
        assert seen["nobody"] is None  # no rank had one: AdamW skips it, as in one process
        assert seen["count"].item() == 7.0 and seen["count"].dtype == torch.float64
        assert seen["gathered"] == [{"rank": 0}, {"rank": 1}]
        assert seen["broadcast"] == "from 0"
        assert seen["tensor"].tolist() == [0.0, 0.0]
        assert seen["on_main"] == "rank 0 refuses"
        assert seen["scatter"] == f"to {rank}"
        assert seen["all_agree"] == "rank 1 refuses"  # raised on both ranks


def test_one_process_trainers_refuse_ranks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """N copies of a one-process trainer would write one run directory N times."""
    from turnrl.train.online.trainer import OnlineTrainer
    from turnrl.train.run import RunDirectory, RunDirectoryError

    config = load_config(RunConfig, RECIPE, [*RUN, f"run_dir={tmp_path / 'run'}"])
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RunDirectoryError, match="torchrun started 2 ranks that would all write"):
        OnlineTrainer(config)
    assert RunDirectory.open(config, split_over_ranks=True).path == tmp_path / "run"
    assert not (tmp_path / "run").exists()


def test_fsdp2_beside_chunked_logprobs_is_refused_naming_file_line_and_field(
    tmp_path: Path, capsys: Any
) -> None:
    """FSDP2 runs (tests/test_distributed_fsdp.py, with the mismatch pass and the per-
    turn correction too), but not with chunked log-probs (they skip the sharded
    model's weight gathering): one line, file, line and field, exit 2, nothing
    written."""
    from turnrl.cli import main

    config = tmp_path / "fsdp.toml"
    config.write_text('[train]\nsteps = 2\nsharding = "fsdp2"\nlogprob_chunk_tokens = 64\n')
    code = main(["train", "--config", str(config), "--run-dir", str(tmp_path / "run")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    prefix = f"turnrl train: error: config error: {config}:4: train.logprob_chunk_tokens: "
    assert err[0].startswith(prefix)
    assert "must be 0 with train.sharding = 'fsdp2'" in err[0]
    assert not (tmp_path / "run").exists()
    assert load_config(RunConfig, None, []).train.sharding == "none"
