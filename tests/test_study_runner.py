"""``turnrl study run`` on a study of tiny fake cells: it runs what is missing, and a
killed or failed study resumes without running a finished cell again."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from turnrl.study.declaration import DONE_FILE, Arm, Metric, Study, Table, WarmStarts, cells
from turnrl.study.runner import (
    FINISHED,
    MISSING,
    PARTIAL,
    cell_state,
    pending_cells,
    run_study,
)

FAKE_CELL = textwrap.dedent(
    """
    # A stand-in for `turnrl train`: records its invocation, writes config.toml (a run
    # has started), then fails, hangs or finishes as files in its root say.
    import json, pathlib, sys, time
    args = sys.argv[1:]
    run_dir = pathlib.Path(next(a[8:] for a in args if a.startswith("run_dir=")))
    seed = next(a.split("=")[1] for a in args if a.startswith("train.seed="))
    root = pathlib.Path(__file__).parent
    with open(root / "invocations.jsonl", "a") as log:
        log.write(json.dumps({"cell": run_dir.name, "resume": "--resume" in args}) + "\\n")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text("")
    if (root / "commit-while-running").exists():  # HEAD moves on while the cell runs
        import subprocess
        subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "2"], cwd=root, check=True)
    while (root / f"hang-{seed}").exists():
        time.sleep(0.05)
    if (root / f"fail-{seed}").exists():
        sys.exit(3)
    value = float(seed) / 10
    rows = [{"step": 0, "eval_success": 0.0}, {"step": 1, "eval_success": value}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
    """
)

DRIVER = textwrap.dedent(
    """
    import pathlib, sys
    sys.path.insert(0, {tests!r})
    from test_study_runner import fake_study
    from turnrl.study.runner import run_study
    from turnrl.train.stop_signals import RunInterrupted
    root = pathlib.Path({root!r})
    try:
        run_study(fake_study(root), root, jobs=1)
    except RunInterrupted as stop:  # as `turnrl study run` exits on SIGTERM/SIGINT
        sys.exit(stop.exit_code)
    """
)


def fake_study(root: Path, warm: bool = False) -> Study:
    (root / "fake_cell.py").write_text(FAKE_CELL)
    (root / "recipe.toml").write_text("")
    return Study(
        name="fake",
        title="fake",
        config="recipe.toml",
        program=("{python}", str(root / "fake_cell.py")),
        arms=(Arm("a"),),
        seeds=(0, 1, 2, 3),
        warm_starts=WarmStarts(count=1) if warm else None,
        tables=(Table("seeds", "seeds", (Metric("eval_success", "success"),)),),
    )


def running_commands_with(fragment: str) -> list[str]:
    """Command lines of the live processes that contain ``fragment`` (read from /proc)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended while being read
            continue
        if fragment in command:
            found.append(command)
    return found


def invocations(root: Path) -> list[dict]:
    path = root / "invocations.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_runs_missing_cells_and_skips_finished_ones(tmp_path: Path) -> None:
    study = fake_study(tmp_path)
    assert [cell_state(c) for c in cells(study, tmp_path)] == [MISSING] * 4
    outcomes = run_study(study, tmp_path, jobs=2)
    assert sorted(o.cell.seed for o in outcomes) == [0, 1, 2, 3]
    assert all(o.returncode == 0 for o in outcomes)
    record = json.loads((cells(study, tmp_path)[0].run_dir / DONE_FILE).read_text())
    assert record["command"][-2:] == [
        "train.seed=0",
        f"run_dir={tmp_path}/runs/studies/fake/a/seed0",
    ]
    assert run_study(study, tmp_path, jobs=2) == []  # nothing left to run
    assert len(invocations(tmp_path)) == 4


def test_a_failed_cell_is_resumed_alone(tmp_path: Path) -> None:
    study = fake_study(tmp_path)
    (tmp_path / "fail-1").write_text("")
    outcomes = run_study(study, tmp_path, jobs=1)
    assert {o.cell.seed: o.returncode for o in outcomes} == {0: 0, 1: 3, 2: 0, 3: 0}
    states = [cell_state(c) for c in cells(study, tmp_path)]
    assert states == [FINISHED, PARTIAL, FINISHED, FINISHED]
    (tmp_path / "fail-1").unlink()
    again = run_study(study, tmp_path, jobs=1)
    assert [(o.cell.seed, o.returncode) for o in again] == [(1, 0)]
    assert invocations(tmp_path)[-1] == {"cell": "seed1", "resume": True}
    assert len(invocations(tmp_path)) == 5


def test_a_killed_study_resumes_without_rerunning_finished_cells(tmp_path: Path) -> None:
    fake_study(tmp_path)
    (tmp_path / "hang-2").write_text("")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER.format(tests=str(Path(__file__).parent), root=str(tmp_path))],
        start_new_session=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    started = cells(fake_study(tmp_path), tmp_path)[2].run_dir / "config.toml"
    while not started.exists():  # seed2 has begun its run (and hangs): kill it mid-way
        assert driver.poll() is None and time.monotonic() < deadline, "seed2 never started"
        time.sleep(0.05)
    os.killpg(driver.pid, signal.SIGKILL)  # the study and its running cell, mid-way
    driver.wait()
    study = fake_study(tmp_path)
    assert [cell_state(c) for c in cells(study, tmp_path)] == [FINISHED, FINISHED, PARTIAL, MISSING]
    (tmp_path / "hang-2").unlink()
    resumed = run_study(study, tmp_path, jobs=1)
    assert [o.cell.seed for o in resumed] == [2, 3]
    assert [(i["cell"], i["resume"]) for i in invocations(tmp_path)] == [
        ("seed0", False),
        ("seed1", False),
        ("seed2", False),
        ("seed2", True),
        ("seed3", False),
    ]


def test_sigterm_stops_the_study_and_leaves_no_cell_running(tmp_path: Path) -> None:
    """SIGTERM to the study process alone (not its group, as `kill PID` sends it): the
    hanging cell is terminated, the study exits 143, and the cell resumes later."""
    fake_study(tmp_path)
    (tmp_path / "hang-0").write_text("")
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER.format(tests=str(Path(__file__).parent), root=str(tmp_path))],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")},
    )
    started = cells(fake_study(tmp_path), tmp_path)[0].run_dir / "config.toml"
    deadline = time.monotonic() + 120
    while not started.exists():
        assert driver.poll() is None and time.monotonic() < deadline, "seed0 never started"
        time.sleep(0.05)
    os.kill(driver.pid, signal.SIGTERM)
    assert driver.wait(timeout=120) == 128 + signal.SIGTERM
    assert running_commands_with(str(tmp_path / "fake_cell.py")) == []  # none outlived it
    assert [i["cell"] for i in invocations(tmp_path)] == ["seed0"]
    assert cell_state(cells(fake_study(tmp_path), tmp_path)[0]) == PARTIAL


def test_warm_starts_run_first_and_only_selects_cells(tmp_path: Path) -> None:
    study = fake_study(tmp_path, warm=True)
    every = cells(study, tmp_path)
    assert [c.key for c in every[:2]] == ["warm/ws0", "a/ws0-seed0"]
    assert f"warm_start.init_from={tmp_path}/runs/studies/fake/warm/ws0/warm_start" in every[1].argv
    outcomes = run_study(study, tmp_path, only=["seed3"])
    assert [o.cell.key for o in outcomes] == ["warm/ws0", "a/ws0-seed3"]


def seed_major_study(root: Path) -> Study:
    """Three arms x two seeds, a warm start per seed (the search-agent study's shape)."""
    base = fake_study(root)
    return Study(
        name=base.name,
        title=base.title,
        config=base.config,
        program=base.program,
        arms=(Arm("a"), Arm("b"), Arm("c")),
        seeds=(0, 1),
        warm_starts=WarmStarts(count=1, per_seed=True),
        tables=base.tables,
    )


def test_cells_run_seed_major_so_a_study_cut_short_has_whole_seeds(tmp_path: Path) -> None:
    """Every arm's seed 0 runs before any arm's seed 1, so stopping a study early
    leaves whole seeds (every arm paired with the baseline)."""
    outcomes = run_study(seed_major_study(tmp_path), tmp_path, jobs=1)
    assert [o.cell.key for o in outcomes] == [
        "warm/ws0",
        "warm/ws1",
        "a/seed0",
        "b/seed0",
        "c/seed0",
        "a/seed1",
        "b/seed1",
        "c/seed1",
    ]


def test_only_one_seed_runs_its_own_warm_start_and_every_arm(tmp_path: Path) -> None:
    outcomes = run_study(seed_major_study(tmp_path), tmp_path, jobs=1, only=["seed0"])
    assert [o.cell.key for o in outcomes] == ["warm/ws0", "a/seed0", "b/seed0", "c/seed0"]


def test_warm_starts_with_named_seeds_use_them_as_train_seeds(tmp_path: Path) -> None:
    study = fake_study(tmp_path)
    named = dataclasses.replace(study, warm_starts=WarmStarts(count=2, seeds=(0, 3)))
    every = cells(named, tmp_path)
    assert [c.key for c in every[:2]] == ["warm/ws0", "warm/ws3"]
    assert every[1].argv[-2:] == (
        "train.seed=3",
        f"run_dir={tmp_path}/runs/studies/fake/warm/ws3",
    )
    rl = [c for c in every if not c.is_warm_start]
    assert [c.key for c in rl] == [f"a/ws{w}-seed{k}" for w in (0, 3) for k in (0, 1, 2, 3)]
    assert {c.warm_from for c in rl} == {"warm/ws0", "warm/ws3"}
    ws3 = f"warm_start.init_from={tmp_path}/runs/studies/fake/warm/ws3/warm_start"
    assert all((ws3 in c.argv) == (c.warm == 3) for c in rl)


def test_warm_start_seeds_must_be_count_distinct_seeds() -> None:
    with pytest.raises(ValueError, match="distinct seeds"):
        WarmStarts(count=2, seeds=(0, 0))
    with pytest.raises(ValueError, match="distinct seeds"):
        WarmStarts(count=3, seeds=(0, 3))
    with pytest.raises(ValueError, match="exclude each other"):
        WarmStarts(count=2, seeds=(0, 3), per_seed=True)
    assert WarmStarts(count=2, seeds=(1, 4)).seeds == (1, 4)


def consumer_of(source: Study, *warm_seeds: int) -> Study:
    """A study whose warm starts are ``source``'s cells of arm ``a`` and ``warm_seeds``."""
    shared = WarmStarts(count=len(warm_seeds), seeds=warm_seeds, cells_of=source, cells_arm="a")
    return dataclasses.replace(
        source, name="consumer", arms=(Arm("b"),), seeds=(7,), warm_starts=shared
    )


def test_warm_starts_can_be_another_studys_cells(tmp_path: Path) -> None:
    source = fake_study(tmp_path)
    consumer = consumer_of(source, 1, 3)
    every = cells(consumer, tmp_path)
    assert [(c.key, c.is_warm_start) for c in every] == [
        ("a/seed1", True),
        ("a/seed3", True),
        ("b/ws1-seed7", False),
        ("b/ws3-seed7", False),
    ]
    source_dir = tmp_path / "runs/studies/fake/a"
    assert every[0].run_dir == source_dir / "seed1"
    assert every[0].argv == cells(source, tmp_path)[1].argv  # the source's own command
    assert [c.warm_from for c in every[2:]] == ["a/seed1", "a/seed3"]
    assert f"warm_start.init_from={source_dir}/seed3/warm_start" in every[3].argv
    outcomes = run_study(consumer, tmp_path, jobs=1)
    assert [o.cell.key for o in outcomes] == ["a/seed1", "a/seed3", "b/ws1-seed7", "b/ws3-seed7"]
    # the source study then runs only what the consumer did not
    assert [o.cell.key for o in run_study(source, tmp_path, jobs=1)] == ["a/seed0", "a/seed2"]
    assert [i["cell"] for i in invocations(tmp_path)].count("seed1") == 1


RESTORED = "runs/studies/fake/a"


def test_a_restored_shared_warm_start_runs_again_only_when_a_cell_needs_it(
    tmp_path: Path,
) -> None:
    """A restored cell has no checkpoint: a cell still to run from it needs it run again;
    with every cell that starts from it finished, it stays as restored."""
    from turnrl.study.archive import restore, write_archive

    source = fake_study(tmp_path)
    run_study(source, tmp_path, jobs=1)
    write_archive(source, tmp_path)
    for cell in cells(source, tmp_path):
        for path in cell.run_dir.iterdir():
            path.unlink()
        cell.run_dir.rmdir()
    assert len(restore(source, tmp_path)) == 4
    before = len(invocations(tmp_path))
    # what `turnrl study run` counts for its progress bar: the warm start as well
    assert [c.key for c in pending_cells(consumer_of(source, 2), tmp_path)] == [
        "a/seed2",
        "b/ws2-seed7",
    ]
    outcomes = run_study(consumer_of(source, 2), tmp_path, jobs=1)
    assert [o.cell.key for o in outcomes] == ["a/seed2", "b/ws2-seed7"]
    assert [i["cell"] for i in invocations(tmp_path)[before:]] == ["seed2", "ws2-seed7"]
    assert "restored_from" not in json.loads(
        (tmp_path / f"{RESTORED}/seed2/{DONE_FILE}").read_text()
    )
    assert "restored_from" in json.loads((tmp_path / f"{RESTORED}/seed1/{DONE_FILE}").read_text())
    assert run_study(consumer_of(source, 2), tmp_path, jobs=1) == []  # all finished now


def test_warm_starts_from_another_study_name_one_of_its_arms(tmp_path: Path) -> None:
    source = fake_study(tmp_path)
    with pytest.raises(ValueError, match="cells_arm 'z' is not an arm of study 'fake'"):
        WarmStarts(count=1, cells_of=source, cells_arm="z")
    with pytest.raises(ValueError, match="exclude each other"):
        WarmStarts(count=1, cells_of=source, cells_arm="a", per_setting=True)
    with pytest.raises(ValueError, match="warm start 9 is not a cell of study 'fake'"):
        cells(consumer_of(source, 9), tmp_path)


def head(root: Path) -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True
    ).stdout.strip()


def test_a_cell_records_the_commit_it_started_at_not_the_one_at_its_end(
    tmp_path, monkeypatch
) -> None:
    """A cell imports the code of the commit it starts at; a study running for hours
    while commits land recorded the later HEAD as each cell's commit."""
    for who in ("AUTHOR", "COMMITTER"):  # the fake cell commits too (it inherits these)
        monkeypatch.setenv(f"GIT_{who}_NAME", "t")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "t@t")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    study = dataclasses.replace(fake_study(tmp_path), seeds=(0,))
    (tmp_path / ".gitignore").write_text("*\n")
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "1"], cwd=tmp_path, check=True)
    first = head(tmp_path)
    (tmp_path / "commit-while-running").write_text("")
    [outcome] = run_study(study, tmp_path)
    assert outcome.returncode == 0
    assert head(tmp_path) != first
    assert json.loads((outcome.cell.run_dir / DONE_FILE).read_text())["commit"] == first
