"""Experiment trackers (``[logging] trackers``): every metrics row of a run, also sent to
TensorBoard, Weights & Biases, MLflow or Trackio, offline by default.

One small interface, :class:`Tracker` (``start``, ``log(step, row)``, ``finish``), and
one adapter per library; the libraries are optional (the ``trackers`` extra) and
imported only when a run names them. Where each writes, with ``logging.offline``
(the default)::

    tensorboard/   TensorBoard event files (``tensorboard --logdir RUN_DIR/tensorboard``)
    wandb/         a W&B offline run (``wandb sync RUN_DIR/wandb/offline-run-*`` uploads it)
    mlruns/        MLflow's file store (``mlflow ui --backend-store-uri RUN_DIR/mlruns``)
    trackio/       Trackio's local SQLite store (``TRACKIO_DIR=RUN_DIR/trackio trackio show``)

Trackio reads its store's directory from ``TRACKIO_DIR`` once, when it is first
imported: a run sets it to ``RUN_DIR/trackio`` unless the variable is set already or
Trackio was imported before in the same process (then the store is where Trackio says,
and the run's log line names it).

Failures never lose the run: a tracker that cannot start is a :class:`TrackerError`
(exit code 2) raised by :meth:`RunTrackers.start` before any training work; one that
fails later is dropped with one warning on stderr, and ``metrics.jsonl`` (written
first) keeps every row.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from turnrl.errors import TurnrlError

TRACKERS = ("mlflow", "tensorboard", "trackio", "wandb")
"""The trackers ``logging.trackers`` may name."""

MODULES = {"mlflow": "mlflow", "tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb"}
"""The module each tracker imports (the ``trackers`` extra installs them)."""


class TrackerError(TurnrlError, RuntimeError):
    """A tracker named in ``logging.trackers`` could not start (exit code 2)."""


@dataclass(frozen=True)
class RunInfo:
    """What a tracker records about the run besides its metrics."""

    run_dir: Path
    name: str
    """The run's label (its directory's name by default)."""
    project: str
    """``logging.project``: the W&B project, MLflow experiment, Trackio project."""
    config: dict[str, Any]
    """The run's config as plain data (sections as nested dicts)."""
    commit: str
    """The git commit of the turnrl source tree the run uses."""
    offline: bool
    """``logging.offline``: write only local files."""
    resumed_after: int | None = None
    """The checkpoint's step when the run resumes (its later steps are redone)."""


class Tracker(Protocol):
    """One experiment tracker. ``start`` raises on failure (the run has not begun);
    ``log`` receives numeric rows only (see :func:`numeric_row`)."""

    name: str

    def start(self, info: RunInfo) -> None: ...

    def log(self, step: int, row: Mapping[str, float]) -> None: ...

    def finish(self) -> None: ...


def numeric_row(row: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a metrics row (booleans as 0/1, nested dicts as ``a/b``); text,
    lists, ``None`` and non-finite values are left out (trackers plot numbers)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(numeric_row(value, f"{name}/"))
        elif isinstance(value, bool | int | float) and math.isfinite(float(value)):
            out[name] = float(value)
    out.pop("step", None)
    return out


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """The config as ``section.field -> text`` (MLflow params, TensorBoard text)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat_params(value, f"{name}."))
        else:
            out[name] = str(value)
    return out


# --------------------------------------------------------------------------- adapters


class TensorBoardTracker:
    """Event files under ``RUN_DIR/tensorboard`` (torch's ``SummaryWriter``, which needs
    the ``tensorboard`` package); the config and commit as text summaries. A resumed run
    hides the killed run's events after its checkpoint (``purge_step``): they are redone."""

    name = "tensorboard"

    def start(self, info: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        purge = None if info.resumed_after is None else info.resumed_after + 1
        self.writer = SummaryWriter(log_dir=str(info.run_dir / "tensorboard"), purge_step=purge)
        self.writer.add_text("commit", info.commit)
        params = flat_params(info.config)
        self.writer.add_text("config", "\n".join(f"    {k} = {v}" for k, v in params.items()))
        self.writer.flush()

    def log(self, step: int, row: Mapping[str, float]) -> None:
        for key, value in row.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run in ``RUN_DIR/wandb``: offline (``mode="offline"``, nothing sent; ``wandb
    sync`` uploads it later) unless ``logging.offline = false``. Config and commit go to
    the run's config."""

    name = "wandb"

    def start(self, info: RunInfo) -> None:
        import wandb

        self.run = wandb.init(
            project=info.project,
            name=info.name,
            dir=str(info.run_dir),
            mode="offline" if info.offline else "online",
            config={**info.config, "git_commit": info.commit},
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
            reinit="create_new",
        )

    def log(self, step: int, row: Mapping[str, float]) -> None:
        self.run.log(dict(row), step=step)

    def finish(self) -> None:
        import wandb

        self.run.finish()
        wandb.teardown()  # stop wandb's service now, not in an atexit hook at exit


class MlflowTracker:
    """An MLflow run in the file store ``RUN_DIR/mlruns`` (experiment
    ``logging.project``), or at ``MLFLOW_TRACKING_URI`` when ``logging.offline = false``.
    The config as params (``section.field``), the commit as the
    ``mlflow.source.git.commit`` tag."""

    name = "mlflow"

    def start(self, info: RunInfo) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = None
        if info.offline:  # MLflow 3 keeps the file store but asks for an explicit opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (info.run_dir / "mlruns").resolve().as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(info.project)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(info.project)
        )
        run = self.client.create_run(
            experiment_id,
            run_name=info.name,
            tags={"mlflow.source.git.commit": info.commit},
        )
        self.run_id = run.info.run_id
        params = [Param(k, v[:6000]) for k, v in flat_params(info.config).items()]
        for first in range(0, len(params), 100):  # MLflow's batch limit
            self.client.log_batch(self.run_id, params=params[first : first + 100])

    def log(self, step: int, row: Mapping[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k.replace("@", "_at_"), v, now, step) for k, v in row.items()]
        for first in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[first : first + 1000])

    def finish(self) -> None:
        self.client.set_terminated(self.run_id)


class TrackioTracker:
    """A Trackio run in its local SQLite store (``RUN_DIR/trackio``, see the module
    docstring), project ``logging.project``; the config and commit as its config."""

    name = "trackio"

    def start(self, info: RunInfo) -> None:
        wanted = (info.run_dir / "trackio").resolve()
        if "trackio" not in sys.modules:
            os.environ.setdefault("TRACKIO_DIR", str(wanted))
        import trackio
        from trackio.utils import TRACKIO_DIR

        if Path(TRACKIO_DIR).resolve() != wanted:
            print(f"turnrl: trackio writes to {TRACKIO_DIR} (TRACKIO_DIR)", file=sys.stderr)
        with contextlib.redirect_stdout(io.StringIO()):  # its banner, with terminal codes
            self.run = trackio.init(
                project=info.project,
                name=info.name,
                config={**info.config, "git_commit": info.commit},
                embed=False,
                auto_log_gpu=False,
                auto_log_cpu=False,
            )

    def log(self, step: int, row: Mapping[str, float]) -> None:
        self.run.log(dict(row), step=step)

    def finish(self) -> None:
        import trackio
        from trackio import context_vars

        with contextlib.redirect_stdout(io.StringIO()):  # "Uploading logs to Trackio"
            if context_vars.current_run.get() is self.run:
                trackio.finish()  # also forgets the run: no second finish at exit
            else:
                self.run.finish()


ADAPTERS: dict[str, Callable[[], Tracker]] = {
    "mlflow": MlflowTracker,
    "tensorboard": TensorBoardTracker,
    "trackio": TrackioTracker,
    "wandb": WandbTracker,
}
"""The adapter of each tracker name (tests put failing ones here)."""


def tracker_directory(name: str) -> str:
    """Where tracker ``name`` writes inside the run directory (the docs' table)."""
    return {"mlflow": "mlruns", "wandb": "wandb"}.get(name, name)


# --------------------------------------------------------------------------- the run's set


def source_commit() -> str:
    """The git commit of the source tree turnrl is imported from (``+ uncommitted
    changes`` when dirty), or ``unknown (...)`` outside a checkout."""
    root = Path(__file__).resolve().parents[3]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no git)"
    if not commit:
        return "unknown (not a git checkout)"
    return commit + (" + uncommitted changes" if dirty else "")


class RunTrackers:
    """The trackers of one run. :meth:`start` starts all of them (or raises
    :class:`TrackerError` naming the first that failed, after finishing the others);
    :meth:`log` sends a row to each, dropping one that fails with a single warning;
    :meth:`finish` closes them (a failure there is a warning too)."""

    def __init__(self, names: list[str] | tuple[str, ...]) -> None:
        self.names = list(names)
        self.active: list[Tracker] = []

    def start(self, info: RunInfo) -> None:
        for name in self.names:
            tracker = ADAPTERS[name]()
            try:
                tracker.start(info)
            except Exception as err:
                self.finish()
                detail = " ".join(str(err).split()) or type(err).__name__
                raise TrackerError(
                    f"logging.trackers: {name} failed to start: {detail} "
                    f"(writing to {info.run_dir / tracker_directory(name)})"
                ) from err
            self.active.append(tracker)

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        numbers = numeric_row(row)
        for tracker in list(self.active):
            try:
                tracker.log(step, numbers)
            except Exception as err:
                self._drop(tracker, f"failed at step {step}", err)

    def finish(self) -> None:
        for tracker in list(self.active):
            try:
                tracker.finish()
            except Exception as err:
                self._drop(tracker, "failed to finish", err)
        self.active = []

    def _drop(self, tracker: Tracker, what: str, err: BaseException) -> None:
        self.active.remove(tracker)
        detail = " ".join(str(err).split()) or type(err).__name__
        print(
            f"turnrl: warning: tracker {tracker.name} {what} ({detail}); it logs nothing "
            "more, metrics.jsonl keeps every row",
            file=sys.stderr,
            flush=True,
        )
