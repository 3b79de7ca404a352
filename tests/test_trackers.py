"""``[logging] trackers``: a real tiny training run (``turnrl train`` in a subprocess)
logs to TensorBoard, W&B (offline), MLflow (file store) and Trackio (local store); each
library's own reader finds every step's metrics, the config and the commit. A tracker
that cannot start stops the run before any work (one line, exit 2); one that fails
mid-run is one warning, and the run and its other trackers go on."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import struct
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, TINY_TRAIN
from turnrl.train.trackers import (
    ADAPTERS,
    MODULES,
    TRACKERS,
    RunInfo,
    RunTrackers,
    numeric_row,
)

INSTALLED = [n for n in TRACKERS if importlib.util.find_spec(MODULES[n]) is not None]


def needs(name: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        name not in INSTALLED, reason=f"{name} is not installed (pip install 'turnrl[trackers]')"
    )


def run_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env.pop("TRACKIO_DIR", None)
    env.pop("WANDB_MODE", None)
    return env


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """One tiny ``turnrl train`` (2 steps) with every installed tracker; its directory
    and its metrics rows."""
    if not INSTALLED:
        pytest.skip("no tracker is installed (pip install 'turnrl[trackers]')")
    run_dir = tmp_path_factory.mktemp("tracked") / "run"
    names = json.dumps(INSTALLED)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "turnrl.cli",
            "train",
            "--config",
            str(REPO / "examples" / "calculator.toml"),
            "--run-dir",
            str(run_dir),
            *TINY_TRAIN,
            "train.steps=2",
            "train.epochs=1",
            "env.env_kwargs={max_turns = 2, turn_cost = 0.0}",  # short episodes: fast steps
            f"logging.trackers={names}",
            "logging.project=trackers-test",
            "label=tracked",
        ],
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    where = ", ".join(f"{n} -> {run_dir / {'mlflow': 'mlruns'}.get(n, n)}" for n in INSTALLED)
    assert f"trackers: {where}" in done.stdout.splitlines()
    assert "\x1b[" not in done.stdout.split("RL: done")[0]  # the libraries' banners silenced
    assert "Traceback" not in done.stderr  # wandb's service is stopped, not torn at exit
    # TINY_TRAIN's logging.report = false: no HTML report, and the line says how to write it
    skipped = f"report: not written (logging.report = false; `turnrl report {run_dir}` writes it)"
    assert skipped in done.stdout.splitlines()
    assert not (run_dir / "report.html").exists()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    return run_dir, rows


def expected(rows: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """What every tracker must hold: each step's numeric metrics."""
    return {int(r["step"]): numeric_row(r) for r in rows}


def assert_holds(got: Mapping[int, Mapping[str, float]], rows: list[dict[str, Any]], rel: float):
    want = expected(rows)
    assert sorted(got) == sorted(want)
    for step, metrics in want.items():
        assert metrics, step
        for key, value in metrics.items():
            assert key in got[step], (step, key)
            assert math.isclose(got[step][key], value, rel_tol=rel, abs_tol=rel), (step, key)


def test_rows_carry_the_drift_diagnostics(tracked_run: tuple[Path, list[dict[str, Any]]]) -> None:
    """metrics.jsonl's training rows hold the #489 diagnostics, in range."""
    _, rows = tracked_run
    for row in rows[1:]:
        for key in ("mixed_group_frac", "zero_adv_group_frac", "adv_mean_turn0", "tool_rate"):
            assert key in row, key
        assert 0.0 <= row["mixed_group_frac"] <= 1.0
        assert 0.0 <= row["zero_adv_group_frac"] <= 1.0


@needs("tensorboard")
def test_tensorboard_event_files(tracked_run: tuple[Path, list[dict[str, Any]]]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, rows = tracked_run
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    got: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            got.setdefault(event.step, {})[tag] = event.value
    assert_holds(got, rows, rel=1e-6)  # event files hold float32
    texts = events.Tags()["tensors"]
    assert "config/text_summary" in texts and "commit/text_summary" in texts


@needs("mlflow")
def test_mlflow_file_store(
    tracked_run: tuple[Path, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run_dir, rows = tracked_run
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("trackers-test")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "tracked"
    got: dict[int, dict[str, float]] = {}
    for key in run.data.metrics:
        for metric in client.get_metric_history(run.info.run_id, key):
            got.setdefault(metric.step, {})[key] = metric.value
    assert_holds(got, rows, rel=1e-12)
    assert run.data.params["train.steps"] == "2"
    assert run.data.params["logging.trackers"] == str(INSTALLED)
    assert len(run.data.tags["mlflow.source.git.commit"]) >= 12


def wandb_records(path: Path) -> Iterator[Any]:
    """The protobuf records of a W&B run file (``run-ID.wandb``): W&B's own ``Record``
    message (``wandb.proto``) inside the LevelDB log framing wandb writes (7-byte file
    header, 32 KiB blocks, chunks of crc32c, length, kind). wandb 0.31 has no Python
    reader of its own (its Go core reads these)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, chunk, block = 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        body, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:
            continue
        chunk = body if kind in (1, 2) else chunk + body  # FULL/FIRST start a record
        if kind in (1, 4):  # FULL/LAST end it
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            yield record


@needs("wandb")
def test_wandb_offline_run(tracked_run: tuple[Path, list[dict[str, Any]]]) -> None:
    run_dir, rows = tracked_run
    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    got: dict[int, dict[str, float]] = {}
    config: dict[str, Any] = {}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            got[int(items.pop("_step"))] = {k: v for k, v in items.items() if k[:1] != "_"}
        elif kind == "run":
            config.update({u.key: json.loads(u.value_json) for u in record.run.config.update})
    assert_holds(got, rows, rel=1e-12)
    assert config["train"]["steps"] == 2
    assert len(config["git_commit"]) >= 12


@needs("trackio")
def test_trackio_local_store(
    tracked_run: tuple[Path, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, rows = tracked_run
    code = (
        "import json; from trackio.sqlite_storage import SQLiteStorage as S; "
        "print(json.dumps([S.get_logs('trackers-test', 'tracked'), "
        "S.get_run_config('trackers-test', 'tracked')]))"
    )
    env = run_env() | {"TRACKIO_DIR": str(run_dir / "trackio")}  # read at import
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    logs, config = json.loads(done.stdout.strip().splitlines()[-1])
    got = {
        int(entry["step"]): {k: v for k, v in entry.items() if k not in ("step", "timestamp")}
        for entry in logs
    }
    assert_holds(got, rows, rel=1e-12)
    assert config["train"]["steps"] == 2
    assert len(config["git_commit"]) >= 12


# ------------------------------------------------------------------------- failures


class Recording:
    """A tracker that keeps what it receives; ``fail_at`` makes ``log`` raise there."""

    def __init__(self, name: str, fail_at: int | None = None) -> None:
        self.name = name
        self.fail_at = fail_at
        self.rows: dict[int, dict[str, float]] = {}
        self.finished = False

    def start(self, info: RunInfo) -> None:
        self.info = info

    def log(self, step: int, row: Mapping[str, float]) -> None:
        if step == self.fail_at:
            raise ConnectionError("disk quota exceeded\n(detail)")
        self.rows[step] = dict(row)

    def finish(self) -> None:
        self.finished = True


def info(tmp_path: Path) -> RunInfo:
    return RunInfo(tmp_path, "r", "p", {"train": {"steps": 3}}, "abc", True)


def test_mid_run_failure_is_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The failing tracker is dropped with one stderr line; the other gets every row."""
    broken, kept = Recording("wandb", fail_at=2), Recording("mlflow")
    monkeypatch.setitem(ADAPTERS, "wandb", lambda: broken)
    monkeypatch.setitem(ADAPTERS, "mlflow", lambda: kept)
    trackers = RunTrackers(["wandb", "mlflow"])
    trackers.start(info(tmp_path))
    rows = [{"step": s, "success": s / 4, "note": "text", "nested": {"a": s}} for s in range(5)]
    for row in rows:
        trackers.log(row["step"], row)
    trackers.finish()
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "turnrl: warning: tracker wandb failed at step 2 (disk quota exceeded (detail)); it "
        "logs nothing more, metrics.jsonl keeps every row"
    ]
    assert sorted(broken.rows) == [0, 1] and not broken.finished
    assert kept.rows == {s: {"success": s / 4, "nested/a": float(s)} for s in range(5)}
    assert kept.finished


@needs("mlflow")
@needs("wandb")
def test_start_failure_stops_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``turnrl train`` with a tracker that cannot start: one line naming it, exit 2, no
    warm start; a tracker started before it is finished again."""
    from turnrl.cli import main

    started = Recording("mlflow")

    class Refusing(Recording):
        def start(self, info: RunInfo) -> None:
            raise PermissionError(f"[Errno 13] Permission denied: '{info.run_dir}/wandb'")

    monkeypatch.setitem(ADAPTERS, "mlflow", lambda: started)
    monkeypatch.setitem(ADAPTERS, "wandb", lambda: Refusing("wandb"))
    run_dir = tmp_path / "run"
    code = main(
        [
            "train",
            "--config",
            str(REPO / "examples" / "calculator.toml"),
            "--run-dir",
            str(run_dir),
            *TINY_TRAIN,
            'logging.trackers=["mlflow", "wandb"]',
        ]
    )
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2
    assert len(err) == 1, err
    assert "logging.trackers: wandb failed to start: [Errno 13] Permission denied" in err[0]
    assert "rerun with --resume" in err[0]
    assert started.finished
    assert not (run_dir / "warm_start").exists()
    assert not (run_dir / "metrics.jsonl").exists()


def test_unknown_and_missing_trackers_are_config_errors(tmp_path: Path) -> None:
    from turnrl.errors import ConfigError
    from turnrl.train.config import RunConfig
    from turnrl.train.validate import validate

    config = RunConfig(run_dir=str(tmp_path / "run"))
    config.logging.trackers = ["tensorbord", "mlflow", "mlflow"]
    with pytest.raises(ConfigError) as raised:
        validate(config)
    assert raised.value.problems == [
        (
            "logging.trackers",
            "unknown 'tensorbord'; allowed: mlflow, tensorboard, trackio, wandb",
        ),
        ("logging.trackers", "names a tracker twice: ['tensorbord', 'mlflow', 'mlflow']"),
    ]
    assert not (tmp_path / "run").exists()


def test_numeric_row() -> None:
    row = {"step": 3, "a": 1, "b": True, "c": float("nan"), "d": "x", "e": [1], "f": {"g": 2.5}}
    assert numeric_row(row) == {"a": 1.0, "b": 1.0, "f/g": 2.5}


@needs("tensorboard")
def test_tensorboard_resume_purges_the_redone_steps(tmp_path: Path) -> None:
    """A run killed after step 4 and resumed from its step-2 checkpoint: TensorBoard's
    reader shows steps 3 and 4 once, as redone."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from turnrl.train.trackers import TensorBoardTracker

    first = TensorBoardTracker()
    first.start(info(tmp_path))
    for step in range(5):
        first.log(step, {"success": float(step)})
    first.finish()
    resumed = TensorBoardTracker()
    resumed.start(RunInfo(tmp_path, "r", "p", {}, "abc", True, resumed_after=2))
    for step in (3, 4):
        resumed.log(step, {"success": 10.0 * step})
    resumed.finish()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    got = [(e.step, e.value) for e in events.Scalars("success")]
    assert got == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
