"""Damaged or foreign checkpoints and warm starts never cost rows (issue 38).

A checkpoint whose payload is another step's, or lacks the optimiser or the task
sampler, used to be loaded, ``metrics.jsonl`` cut back to its step, and then a
traceback: rows lost. A truncated or deleted ``warm_start/`` gave a SafetensorError
or HFValidationError traceback. Now every checkpoint and the warm start are checked
in full before a resumed run touches anything: a bad newest checkpoint is skipped for
the newest good one (said in one line), and when none is good, or the warm start is
unusable, the run stops with one line (exit code 2) and nothing on disk changes.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from conftest import PARITY, TINY_TRAIN
from test_hostile_run import error_lines, read_jsonl, snapshot
from turnrl.cli import main as turnrl_main
from turnrl.train.checkpoint import load_checkpoint
from turnrl.train.process_tree import descendants

REPO = Path(__file__).resolve().parents[1]
CALCULATOR = str(REPO / "examples" / "calculator.toml")
SETTINGS = (*TINY_TRAIN, *PARITY, "train.checkpoint_every=1", "train.keep_checkpoints=5")


def train_args(run_dir: Path, steps: int, *flags: str) -> list[str]:
    return [
        "train",
        "--quiet",
        *flags,
        "--config",
        CALCULATOR,
        "--run-dir",
        str(run_dir),
        *SETTINGS,
        f"train.steps={steps}",
    ]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-step run with the checkpoints of steps 1, 2 and 3."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert turnrl_main(train_args(run_dir, 3)) == 0
    return run_dir


@pytest.fixture
def run_dir(finished: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    return copy


def rewrite(path: Path, change: Callable[[dict], None]) -> None:
    payload = torch.load(path, weights_only=True)
    change(payload)
    torch.save(payload, path)


def step_1_as_step_3(run_dir: Path) -> None:
    saved = run_dir / "checkpoints"
    shutil.copyfile(saved / "step-000001.pt", saved / "step-000003.pt")


def without_optimiser(run_dir: Path) -> None:
    rewrite(run_dir / "checkpoints" / "step-000003.pt", lambda p: p.update(optimizer=None))


def without_sampler(run_dir: Path) -> None:
    rewrite(run_dir / "checkpoints" / "step-000003.pt", lambda p: p["extra"].pop("sampler"))


DAMAGES = [
    (step_1_as_step_3, "it holds step 1, but its name says step 3"),
    (without_optimiser, "no optimiser state"),
    (without_sampler, "no task sampler state (extra.sampler)"),
]


@pytest.mark.parametrize(("damage", "problem"), DAMAGES, ids=["foreign", "optimiser", "sampler"])
def test_each_damage_is_named_by_the_resumable_check(run_dir: Path, damage, problem: str) -> None:
    """What a resumed run checks each checkpoint with (before touching anything) finds
    each damage and names it; the good checkpoint before it passes."""
    damage(run_dir)
    saved = run_dir / "checkpoints"
    with pytest.raises(ValueError) as refused:
        load_checkpoint(saved / "step-000003.pt", resumable=True)
    assert str(refused.value) == (
        f"{saved / 'step-000003.pt'}: damaged or foreign checkpoint: {problem}"
    )
    assert load_checkpoint(saved / "step-000002.pt", resumable=True)["step"] == 2


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        DAMAGES[0],
        *(pytest.param(*damage, marks=pytest.mark.slow) for damage in DAMAGES[1:]),
    ],
    ids=["foreign", "optimiser", "sampler"],
)
def test_a_bad_newest_checkpoint_is_skipped_for_the_newest_good_one(
    run_dir: Path, capsys: pytest.CaptureFixture[str], damage, problem: str
) -> None:
    """The newest checkpoint (step 3) is damaged: the resumed run says so in one line,
    starts from step 2 and redoes step 3.

    The ``optimiser`` and ``sampler`` variants are in ``make test-slow`` only (#38: 17 s
    of the suite). ``make test`` runs this whole path with the ``foreign`` damage, and
    ``test_each_damage_is_named_by_the_resumable_check`` checks that the same check a
    resumed run makes finds the other two damages and names them as here."""
    before = descendants()
    damage(run_dir)
    code = turnrl_main(train_args(run_dir, 3, "--resume"))
    err = error_lines(capsys.readouterr().err)
    assert code == 0, err
    bad = run_dir / "checkpoints" / "step-000003.pt"
    assert err == [
        f"turnrl: resuming {run_dir} from step 2: skipping {bad}: damaged or foreign "
        f"checkpoint: {problem}"
    ]
    assert [row["step"] for row in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1, 2, 3]
    load_checkpoint(bad, resumable=True)  # step 3 redone: its checkpoint is whole again
    assert descendants() == before


def test_no_good_checkpoint_exits_2_and_changes_nothing(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = run_dir / "checkpoints"
    for step in (1, 2, 3):
        rewrite(saved / f"step-00000{step}.pt", lambda p: p.update(optimizer=None))
    before = snapshot(run_dir)
    code = turnrl_main(train_args(run_dir, 3, "--resume"))
    err = error_lines(capsys.readouterr().err)
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith(f"turnrl train: error: cannot resume {run_dir}: no readable ")
    assert f"{saved / 'step-000001.pt'}: damaged or foreign checkpoint: no optimiser" in err[0]
    assert snapshot(run_dir) == before  # metrics.jsonl whole: rows 0-3 kept


# ----------------------------------------------------------------------- warm start


def deleted(run_dir: Path) -> None:
    shutil.rmtree(run_dir / "warm_start")


def truncated(run_dir: Path) -> None:
    weights = run_dir / "warm_start" / "model.safetensors"
    with weights.open("r+b") as handle:
        handle.truncate(weights.stat().st_size // 2)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (deleted, "its warm start warm_start/ ({run_dir}/warm_start) is missing"),
        (
            truncated,
            "its warm start's model.safetensors is damaged (SafetensorError: Error while "
            "deserializing header: incomplete metadata, file not fully covered)",
        ),
    ],
    ids=["deleted", "truncated"],
)
def test_a_deleted_or_truncated_warm_start_exits_2_naming_it(
    run_dir: Path, capsys: pytest.CaptureFixture[str], damage, problem: str
) -> None:
    damage(run_dir)
    before = snapshot(run_dir)
    code = turnrl_main(train_args(run_dir, 3, "--resume"))
    err = error_lines(capsys.readouterr().err)
    assert code == 2
    assert err == [
        f"turnrl train: error: cannot resume {run_dir}: {problem.format(run_dir=run_dir)}; a "
        "resumed run needs the warm start it began from: use --overwrite to start the run again"
    ]
    assert snapshot(run_dir) == before
