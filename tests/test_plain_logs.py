"""A run whose stdout is not a terminal (a batch job's log) prints one plain line per
phase and per step as they happen, not a rich bar that shows up only at the end."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO, TINY_TRAIN
from test_train_online import check_recipe_run
from turnrl.train.progress import PlainProgress


def test_plain_progress_lines() -> None:
    out = io.StringIO()
    with PlainProgress(stream=out) as bar:
        task = bar.add_task("RL", total=3, completed=1)
        bar.update(task, advance=1, description="RL step 2  success 0.50")
        bar.update(task, advance=1)
    lines = out.getvalue().splitlines()
    assert lines[0] == "RL: 1/3"
    assert re.fullmatch(r"RL 2/3 \(\d+\.\ds\): RL step 2  success 0\.50", lines[1])
    assert re.fullmatch(r"RL 3/3 \(\d+\.\ds\)", lines[2])
    assert re.fullmatch(r"RL: done, 3/3 in \d+\.\ds", lines[3])
    assert len(lines) == 4


def test_plain_progress_disabled_prints_nothing() -> None:
    out = io.StringIO()
    with PlainProgress(disable=True, stream=out) as bar:
        bar.update(bar.add_task("warm start", total=2), advance=1)
    assert out.getvalue() == ""


def test_piped_run_logs_each_phase_and_step(tmp_path: Path) -> None:
    """``turnrl train`` with stdout a pipe: the warm start's steps, its evaluation and
    every RL step each come as a line, in order (rich's bar printed only its final state
    into a pipe, when the phase ended).

    It is also ``make test``'s CLI smoke run of the calculator recipe: what the run
    leaves is checked as ``test_recipe_smoke_run_via_cli`` checks it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "turnrl.cli",
            "train",
            "--config",
            str(REPO / "examples" / "calculator.toml"),
            "--run-dir",
            str(tmp_path / "run"),
            *TINY_TRAIN,
            "train.steps=2",
            "train.epochs=1",
            "logging.report=true",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    lines = [line.rstrip("\n") for line in process.stdout]
    _, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    warm = [x for x in lines if x.startswith("warm start ")]
    assert [x.split()[2] for x in warm] == ["1/6", "2/6", "3/6", "4/6", "5/6", "6/6"]
    order = [
        lines.index("warm start: 0/6"),
        next(i for i, x in enumerate(lines) if x.startswith("warm start: done, 6/6")),
        next(i for i, x in enumerate(lines) if x.startswith("step 0 (the warm start's")),
        lines.index("RL: 0/2"),
        next(i for i, x in enumerate(lines) if x.startswith("RL 1/2 (")),
        next(i for i, x in enumerate(lines) if x.startswith("RL 2/2 (")),
        next(i for i, x in enumerate(lines) if x.startswith("RL: done, 2/2")),
    ]
    assert order == sorted(order)
    assert "RL step 2" in lines[order[5]]
    assert not any("\x1b[" in x for x in lines[: order[-1]])  # no terminal control codes
    check_recipe_run(tmp_path / "run", "\n".join(lines))
