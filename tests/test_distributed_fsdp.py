"""``train.sharding = "fsdp2"``: the learner sharded over 2 gloo ranks equals one process.

Real ``torchrun`` launches of the CLI on the ``parity`` environment, as
tests/test_distributed.py (whose launch helpers these tests share). With FSDP2 every
rank holds half of each weight, gradient and AdamW state; sampling uses a whole copy
gathered once per step; a rank with fewer forwards in a mini-batch pads with
zero-weight forwards. In ``tree-pad`` every mini-batch is one task tree, so in every
optimiser step one rank holds all its rows and the other runs only padding forwards;
``rows-a2tgpo`` needs information gain, computed with the whole copy.

Tolerance: the same as without sharding (``WEIGHT_ATOL = 1e-5`` on weights of order 1
after each of 3 steps; measured under 1e-6) and every float metric within a relative
``METRIC_RTOL``, except what each process computed and ``rows-a2tgpo``'s
(:data:`IG_METRIC_RTOL`). A resumed fsdp2 run equals the
uninterrupted one exactly; checkpoints have the one-process format, so a 2-rank run
without sharding resumes with it (within the tolerance).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import REPO
from test_distributed import (
    METRIC_RTOL,
    RECIPE,
    RUN,
    WEIGHT_ATOL,
    assert_metrics_close,
    crashed_after,
    max_difference,
    metrics,
    train,
    weights,
)
from turnrl.errors import ConfigError, UsageError
from turnrl.train.config import RunConfig, load_config
from turnrl.train.update.ppo import UpdateShard, _lockstep_padding, padding_forward
from turnrl.train.validate import validate

assert METRIC_RTOL == 1e-5 and REPO.is_dir()

FSDP = ("train.sharding=fsdp2",)
LAYOUTS = {
    "tree-pad": ("train.update=tree", "train.minibatch_size=1"),
    "rows-full-kl": ("train.update=rows", "train.aggregation=rollout-mean", "train.kl_coef=0.05"),
    "tree-lora": ("train.update=tree", "policy.lora_rank=4", "train.lr=3e-3"),
    "rows-a2tgpo": ("train.update=rows", "credit.estimator=a2tgpo", "train.max_grad_norm=0"),
}
"""``rows-a2tgpo``: information gain is computed with the whole copy (a forward of the
sharded learner on one rank alone would wait for the others); no clipping, so the
reported norm is computed from the shards without ``clip_grad_norm_``."""

IG_METRIC_RTOL = 1e-4
"""``rows-a2tgpo``'s metrics from step 2 on: its advantages are built from information
gain, a difference of two log-probabilities of one answer, computed with weights that
already differ in the 7th digit (the sharded gradient is summed in another order), and
normalised within turn groups; both cancellations amplify the difference. Measured:
advantage, loss and gradient-norm metrics up to 2.6e-5 relative (the same value on
every run: it is deterministic), with the weights within 1e-6."""
METRIC_RTOLS = {"rows-a2tgpo": IG_METRIC_RTOL}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run directories made once for the module: ``{layout}-1`` one process,
    ``{layout}-fsdp2`` two sharded ranks."""
    root = tmp_path_factory.mktemp("fsdp")

    class Runs(dict):
        def __missing__(self, name: str) -> Path:
            layout, how = name.rsplit("-", 1)
            run_dir = root / name
            if how == "1":
                train(run_dir, 0, *LAYOUTS[layout])
            else:
                train(run_dir, 2, *LAYOUTS[layout], *FSDP)
            self[name] = run_dir
            return run_dir

    return Runs()


FAST_LAYOUT = "tree-pad"
"""The layout of ``make test`` (#38: ``make test`` within 20 minutes); the others run in
``make test-slow`` only, each property covered in ``make test`` as :data:`COVERED` says."""
COVERED = {
    "rows-full-kl": "the rows update with a KL reference, split over 2 ranks, equals one "
    "process (tests/test_distributed.py's ``test_two_ranks_equal_one_process[rows-full-kl]``, "
    "the same layout unsharded), and the sharded learner equals one process "
    "(``tree-pad`` here)",
    "tree-lora": "LoRA's gradients over ranks (tests/test_distributed.py's "
    "``test_collectives_on_two_gloo_ranks``: parameters without gradients stay without) "
    "and the sharded learner equal to one process (``tree-pad`` here)",
    "rows-a2tgpo": "the rows update over ranks (tests/test_distributed.py's "
    "``test_two_ranks_equal_one_process[rows-full-kl]``, with a frozen reference model "
    "beside the learner) and the sharded learner equal to one process (``tree-pad`` here)",
}
"""Per slow layout, the ``make test`` tests that cover its properties."""


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param(layout, marks=[] if layout == FAST_LAYOUT else [pytest.mark.slow])
        for layout in sorted(LAYOUTS)
    ],
)
def test_fsdp2_ranks_equal_one_process(runs: dict[str, Path], layout: str) -> None:
    """``tree-pad`` in ``make test``, the other layouts in ``make test-slow`` only (#38:
    about 65 s each; :data:`COVERED` names the ``make test`` tests that cover each)."""
    one, two = runs[f"{layout}-1"], runs[f"{layout}-fsdp2"]
    for step in (1, 2, 3):
        assert max_difference(weights(one, step), weights(two, step)) <= WEIGHT_ATOL, step
    assert max_difference(weights(two, 2), weights(two, 3)) > 100 * WEIGHT_ATOL
    rows = metrics(two)
    assert all(r["grad_norm"] > 0 for r in rows[1:])  # the global norm (it is compared too)
    assert [r["episodes"] for r in rows[1:]] == [16, 16, 16]
    assert_metrics_close(metrics(one), rows, METRIC_RTOLS.get(layout, METRIC_RTOL))
    # the checkpoint is the one-process format: plain tensors, the same keys, and the
    # optimiser state whole
    saved = torch.load(two / "checkpoints" / "step-000003.pt", weights_only=False)
    reference = torch.load(one / "checkpoints" / "step-000003.pt", weights_only=False)
    assert all(type(t) is torch.Tensor for t in saved["model"].values())
    assert saved["optimizer"]["param_groups"] == reference["optimizer"]["param_groups"]
    for index, state in reference["optimizer"]["state"].items():
        for key, value in state.items():
            got = saved["optimizer"]["state"][index][key]
            assert type(got) is torch.Tensor and got.shape == value.shape, (index, key)
            assert float((got.float() - value.float()).abs().max()) <= WEIGHT_ATOL, (index, key)


@pytest.mark.slow
def test_resumed_fsdp2_run_equals_uninterrupted(runs: dict[str, Path], tmp_path: Path) -> None:
    """Resumed from its step-2 checkpoint (as a crash leaves the run), a sharded run
    equals the uninterrupted one exactly.

    In ``make test-slow`` only (#38: one 2-rank launch more). ``make test`` covers it in
    two halves: a sharded run writes exactly the one-process format (keys, plain
    tensors, the optimiser state whole; ``test_fsdp2_ranks_equal_one_process``), and 2
    ranks resume from that format to the uninterrupted numbers exactly
    (tests/test_distributed.py's ``test_resumed_two_rank_run_equals_uninterrupted``)."""
    whole = runs["tree-pad-fsdp2"]
    cut = crashed_after(whole, 2, tmp_path / "cut")
    train(cut, 2, *LAYOUTS["tree-pad"], *FSDP, resume=True)
    assert metrics(cut) == metrics(whole)
    assert max_difference(weights(cut, 3), weights(whole, 3)) == 0.0


@pytest.mark.slow
def test_unsharded_ranks_resume_sharded(runs: dict[str, Path], tmp_path: Path) -> None:
    """Same checkpoint file: 2 unsharded ranks stopped after step 2, resumed sharded.

    In ``make test-slow`` only (#38: 68 s of the suite). ``make test`` covers it in two
    halves: a sharded run writes exactly the one-process format (keys, plain tensors, the
    optimiser state whole; ``test_fsdp2_ranks_equal_one_process``), the format an
    unsharded run writes, and 2 ranks resume from that format to the uninterrupted
    numbers (tests/test_distributed.py's ``test_resumed_two_rank_run_equals_uninterrupted``;
    sharded, ``test_resumed_fsdp2_run_equals_uninterrupted`` in ``make test-slow``)."""
    whole = runs["tree-pad-1"]
    cut = tmp_path / "cut"
    train(cut, 2, *LAYOUTS["tree-pad"], "train.steps=2")
    train(cut, 2, *LAYOUTS["tree-pad"], *FSDP, resume=True)
    assert max_difference(weights(cut, 3), weights(whole, 3)) <= WEIGHT_ATOL
    assert_metrics_close(metrics(whole), metrics(cut))


def test_sharded_asynchronous_ranks_equal_one_asynchronous_process(tmp_path: Path) -> None:
    """``train.max_staleness = 1`` with a sharded learner (#37; a config error before):
    each rank gathers its whole copy after every update and pushes it to its sampler
    process. Steps 2 and 3 sample one version behind, as in one process at K = 1 (per-
    episode seeds), and the run equals that process: weights within ``WEIGHT_ATOL``
    after the 3 steps (the one checkpoint), metrics within ``METRIC_RTOL`` (the
    per-turn correction's ``mismatch_*`` within that or 1e-6 absolute: the learner's
    pass runs on each rank's rows, padded to the busiest rank's count of forwards)."""
    asynchronous = (
        *LAYOUTS["tree-pad"],
        "train.max_staleness=1",
        "train.tis_cap=2.0",
        "train.checkpoint_every=3",
        "train.eval_every=3",
    )
    one, two = tmp_path / "one", tmp_path / "two"
    train(one, 0, *asynchronous, "rollout.per_episode_seeds=true")
    train(two, 2, *asynchronous, *FSDP)
    rows, alone = metrics(two), metrics(one)
    assert [r["policy_version"] for r in rows[1:]] == [0, 0, 1]
    assert [r["staleness_max"] for r in rows[1:]] == [0.0, 1.0, 1.0]
    for row_one, row_two in zip(alone, rows, strict=True):
        for key in [k for k in row_one if k.startswith("mismatch_")]:
            expected = row_one.pop(key)
            assert row_two.pop(key) == pytest.approx(expected, rel=METRIC_RTOL, abs=1e-6), key
    assert_metrics_close(alone, rows)
    assert max_difference(weights(one, 3), weights(two, 3)) <= WEIGHT_ATOL


# --------------------------------------------------------------------------- pieces


def test_padding_forward_changes_no_gradient() -> None:
    from turnrl.policy.factory import build_tiny_policy
    from turnrl.train.update.ppo import PPOConfig, UpdateBatch

    policy = build_tiny_policy(0, hidden=16, layers=1)
    contexts, responses = [[1, 2, 3, 4], [1, 2]], [[5, 6, 7], [8]]
    batch = UpdateBatch(
        contexts=contexts,
        responses=responses,
        old_logp_B_T=torch.zeros(2, 3),
        mask_B_T=torch.ones(2, 3),
        adv_B=torch.ones(2),
        clip_factor_B=None,
        weight_B_T=torch.full((2, 3), 1 / 6),
        tree_B=torch.tensor([0, 1]),
    )
    policy.response_logprobs(contexts, responses)[0].sum().backward()
    before = {n: p.grad.clone() for n, p in policy.model.named_parameters()}
    for layout in ("rows", "tree"):
        computed = padding_forward(policy, batch, PPOConfig(update=layout), temperature=1.0)
        assert computed == 3  # the shortest row: 2 context + 1 response positions
    for name, parameter in policy.model.named_parameters():
        assert torch.equal(parameter.grad, before[name]), name


def test_lockstep_padding_tops_every_rank_up_to_the_busiest() -> None:
    """Plans: per epoch, per mini-batch, the rows of each forward on this rank."""
    mine = [[[[0, 1]], [], [[2], [3]]], [[[0]], [[1], [2]], []]]
    other = [[[[0]], [[1], [2], [3]], []], [[], [[0]], [[1]]]]
    shard = UpdateShard(
        positions=[],
        tree_B=[],
        reduce_gradients=lambda parameters: None,
        gather=lambda counts: [counts, [[len(m) for m in e] for e in other]],
        lockstep=True,
    )
    assert _lockstep_padding(mine, shard) == [[0, 3, 0], [0, 0, 1]]


def test_fsdp2_refusals_name_the_field(tmp_path: Path) -> None:
    from turnrl.train.online.trainer import OnlineTrainer

    def config(*extra: str) -> RunConfig:
        overrides = [*RUN, f"run_dir={tmp_path / 'run'}", *extra]
        loaded = load_config(RunConfig, RECIPE, overrides)
        validate(loaded, toml_path=RECIPE, overrides=overrides)
        return loaded

    with pytest.raises(UsageError, match=r"train\.sharding = 'fsdp2' shards the learner over"):
        OnlineTrainer(config(*FSDP))
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match=r"train\.logprob_chunk_tokens: must be 0 with"):
        config(*FSDP, "train.logprob_chunk_tokens=64")
    config("train.logprob_chunk_tokens=64")  # without sharding, fine
    # the learner's pass before the update is padded to the busiest rank's forwards:
    # allowed (test_sharded_asynchronous_ranks_equal_one_asynchronous_process runs it)
    for other in ("train.log_mismatch=true", "train.tis_cap=2.0"):
        config(*FSDP, other)


def test_fsdp2_in_an_agent_run_is_refused(tmp_path: Path, capsys: Any) -> None:
    from turnrl.cli import main

    agent = REPO / "examples" / "agents" / "calc_openai.toml"
    code = main(
        ["train", "--config", str(agent), "--run-dir", str(tmp_path / "r"), "train.sharding=fsdp2"]
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.sharding: 'fsdp2' runs on built-in environments" in err[0]
