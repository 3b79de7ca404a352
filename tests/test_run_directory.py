"""The run lifecycle: a run directory that holds a run is never written by another run;
``--resume`` refuses a changed config; ``--overwrite`` replaces; seeds derive from one
place."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from conftest import PARITY, REPO, TINY_ITERATE, TINY_TRAIN
from turnrl.cli import main
from turnrl.train.config import RunConfig, load_config
from turnrl.train.run import (
    RunDirectory,
    RunDirectoryError,
    config_changes,
    derive_seed,
)


def fingerprint(run_dir: Path) -> dict[str, str]:
    """SHA-256 of every file under ``run_dir`` (and the set of paths)."""
    return {
        str(path.relative_to(run_dir)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(run_dir.rglob("*"))
        if path.is_file()
    }


def steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


# --------------------------------------------------------------------------- the guard


def config(run_dir: Path, *overrides: str) -> RunConfig:
    return load_config(RunConfig, None, [f"run_dir={run_dir}", *overrides])


def test_new_and_empty_directories_start_fresh(tmp_path: Path) -> None:
    assert not RunDirectory.open(config(tmp_path / "new")).resuming
    (tmp_path / "empty").mkdir()
    assert not RunDirectory.open(config(tmp_path / "empty"), resume=True).resuming


def test_directory_holding_a_run_needs_resume_or_overwrite(tmp_path: Path) -> None:
    run = RunDirectory.open(config(tmp_path))
    assert run.start() is None  # writes config.toml: the directory holds a run now
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(RunDirectoryError, match=r"holds a run.*--resume.*--overwrite"):
        RunDirectory.open(config(tmp_path))
    assert RunDirectory.open(config(tmp_path), resume=True).resuming
    with pytest.raises(RunDirectoryError, match="exclude each other"):
        RunDirectory.open(config(tmp_path), resume=True, overwrite=True)
    replacing = RunDirectory.open(config(tmp_path, "train.seed=3"), overwrite=True)
    assert list(tmp_path.iterdir())  # nothing deleted before the run starts
    replacing.start()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".turnrl.lock", "config.toml"]
    assert "seed = 3" in (tmp_path / "config.toml").read_text()


def test_directory_without_a_run_is_never_written(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    for flags in ({}, {"resume": True}, {"overwrite": True}):
        with pytest.raises(RunDirectoryError, match="holds no turnrl run"):
            RunDirectory.open(config(tmp_path), **flags)
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirectoryError, match="not a directory"):
        RunDirectory.open(config(tmp_path / "file"))
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_overwrite_refuses_to_delete_its_own_warm_start_source(tmp_path: Path) -> None:
    RunDirectory.open(config(tmp_path)).start()
    (tmp_path / "warm_start").mkdir()
    source = f"warm_start.init_from={tmp_path / 'warm_start'}"
    with pytest.raises(RunDirectoryError, match=r"would delete warm_start\.init_from"):
        RunDirectory.open(config(tmp_path, source), overwrite=True)


def test_resume_allows_only_the_fields_that_may_change(tmp_path: Path) -> None:
    RunDirectory.open(config(tmp_path, "credit.params={gamma = 0.9}")).start()
    same = ["credit.params={gamma = 0.9}"]
    for allowed in ("train.steps=500", "train.eval_every=1", "label=again", "train.threads=1"):
        assert RunDirectory.open(config(tmp_path, *same, allowed), resume=True).resuming
    with pytest.raises(RunDirectoryError) as refused:
        RunDirectory.open(
            config(tmp_path, "train.seed=1", "credit.params={gamma = 0.5, use_std = false}"),
            resume=True,
        )
    message = str(refused.value)
    assert "train.seed (0 -> 1)" in message
    assert "credit.params.gamma (0.9 -> 0.5)" in message
    assert "credit.params.use_std ((unset) -> False)" in message
    assert "train.steps" in message  # the fields that may change are named


def test_config_changes_lists_dotted_keys() -> None:
    old = load_config(RunConfig, None, ["train.steps=5", "env.env_kwargs={a = 1}"])
    new = load_config(RunConfig, None, ["train.steps=6", "env.env_kwargs={a = 2}"])
    assert config_changes(old, new, ()) == ["env.env_kwargs.a (1 -> 2)", "train.steps (5 -> 6)"]
    assert config_changes(old, new, ("train.steps", "env.env_kwargs")) == []
    assert config_changes(old, old, ()) == []


# --------------------------------------------------------------------------- seeds


def test_derive_seed_keeps_the_trainers_streams() -> None:
    # The streams of the first trainers, unchanged (make demo's numbers depend on them).
    assert derive_seed(3, "rollout", 7) == 3 * 1_000_003 + 7
    assert derive_seed(3, "update", 7) == 3 * 100_003 + 7
    assert derive_seed(5, "eval_tasks") == 5 + 7919
    assert derive_seed(2, "q_fit", 1) == 2 * 1009 + 1
    assert derive_seed(2, "improve", 1) == 2 * 1_000_033 + 1
    assert derive_seed(2, "improve_sample", 1) == 2 * 7919 + 1
    assert derive_seed(2, "improve_probe") == 1
    assert derive_seed(2, "deploy_arm", 3) == 2 * 31 + 3
    with pytest.raises(ValueError, match="unknown seed stream 'rolout'; known: deploy_arm"):
        derive_seed(0, "rolout")


# --------------------------------------------------------------------------- CLI: no data loss


def cli(command: str, recipe: str, run: Path, *args: str, tiny: tuple[str, ...]) -> int:
    """``turnrl COMMAND`` of a recipe on ``run``: ``args`` are flags and overrides
    (flags go first: argparse takes no option after the overrides)."""
    flags = [a for a in args if a.startswith("--")]
    overrides = [a for a in args if not a.startswith("--")]
    config = str(REPO / "examples" / recipe)
    argv = [command, "--config", config, "--quiet", "--run-dir", str(run), *flags]
    return main([*argv, *tiny, *overrides])


def test_train_cli_never_writes_over_an_existing_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"

    def train(*args: str) -> int:
        tiny = (*TINY_TRAIN, *PARITY, "train.steps=1")
        return cli("train", "calculator.toml", run, *args, tiny=tiny)

    assert train() == 0
    assert steps(run) == [0, 1]
    before = fingerprint(run)
    assert "checkpoints/step-000001.pt" in before and "warm_start/config.json" in before
    capsys.readouterr()

    refused = {
        "config error": (["credit.estimator=grpoo"], "credit.estimator: unknown 'grpoo'"),
        "a new run": ([], "holds a run (config.toml); give --resume"),
        "resume with another seed": (["--resume", "train.seed=1"], "train.seed (0 -> 1)"),
        "resume with a config error": (["--resume", "train.epochs=0"], "train.epochs"),
        "overwrite with a config error": (["--overwrite", "train.lr=-1"], "train.lr"),
    }
    for name, (args, message) in refused.items():
        assert train(*args) == 2, name
        assert message in capsys.readouterr().err, name
        assert fingerprint(run) == before, name  # byte-identical, every file

    # --resume with more steps continues the same run
    assert train("--resume", "train.steps=2") == 0
    assert steps(run) == [0, 1, 2]
    assert (run / "checkpoints" / "step-000002.pt").exists()
    # --overwrite replaces it: a fresh run, nothing left of the old one
    assert train("--overwrite", "train.seed=1", "train.steps=1") == 0
    assert steps(run) == [0, 1]
    assert "seed = 1" in (run / "config.toml").read_text()
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-000001.pt"]


def test_iterate_cli_never_writes_over_an_existing_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_iterate
) -> None:
    from turnrl.train.iterate.loop import IterativeGRPO

    run = tmp_path / "run"
    tiny = ("iterations=1", "improve.steps=1")
    IterativeGRPO(tiny_iterate(run, *tiny), quiet=True).run()
    before = fingerprint(run)
    for args, message in (
        ((), "holds a run"),
        (("--resume", "seed=4"), "seed (0 -> 4)"),
        (("--resume", "improve.kl_estimator=k9"), "improve.kl_estimator"),
    ):
        argv = ("iterate", "iterate_haggle.toml", run, *args)
        assert cli(*argv, tiny=(*TINY_ITERATE, *tiny)) == 2
        assert message in capsys.readouterr().err
        assert fingerprint(run) == before
    extended = tiny_iterate(run, "iterations=2", "improve.steps=1")  # may change on resume
    IterativeGRPO(extended, quiet=True, resume=True).run()
    assert steps(run) == [0, 1, 2]
