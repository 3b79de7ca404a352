"""One run's directory, shared by every trainer (``turnrl train``, ``turnrl iterate``,
the agent loop): the guard, the lock, ``config.toml``, metrics, checkpoints and the
warm start, i.e. everything a trainer writes that is not its own algorithm. The
order a run goes through (start or resume, steps, evaluations, checkpoints, close)
is :class:`turnrl.train.lifecycle.Lifecycle`'s.

The guard is the data-loss rule: a directory that holds a run (it has a
``config.toml``) is never written by another run. ``RunDirectory.open`` refuses it
unless ``resume`` (and then only if the config differs from the run's
``config.toml`` in nothing but the fields the config class lists in
``MAY_CHANGE_ON_RESUME``) or ``overwrite`` (the directory is emptied when the run
starts). A non-empty directory that holds no run is refused always: it is not ours
to empty. Nothing is written before :meth:`RunDirectory.start` but the lock. The
rules themselves are :mod:`turnrl.train.run_guard`'s.

One process at a time: an existing run directory is locked
(:mod:`turnrl.train.run_lock`, ``.turnrl.lock``) by :meth:`RunDirectory.open`, a new
one by :meth:`RunDirectory.start`, until :meth:`RunDirectory.close` or the process
ends; another process is refused with the holder's pid. Where the directory cannot
be written (a read-only parent, no space left, deleted while the run runs), or a
resumed run has no readable checkpoint, the error is one line naming the path and
the cause (a :class:`~turnrl.errors.TurnrlError`: exit code 2).

Files of a run directory (written here; trainers add their own)::

    config.toml        the resolved config (with every field's docstring)
    warm_start/        the warm-started policy (the KL reference of ``turnrl train``)
    warm_start_losses.json
    metrics.jsonl      one line per step; step 0 is the evaluation after the warm start
    checkpoints/       model + optimiser + RNG + the trainer's extra state, atomically
    policy/            the final policy as a Hugging Face directory (``turnrl export``'s
                       format); ``policy/step-N/``: ``train.export_every``'s exports
    tensorboard/ wandb/ mlruns/ trackio/   ``logging.trackers``' files
                       (:mod:`turnrl.train.trackers`): every metrics row, as it is written

When stdout is not a terminal (a batch job's log), progress is one plain line per phase
and per step (:mod:`turnrl.train.progress`) instead of a rich bar.

Seeds: every random stream of a run derives from the config's seed through
:func:`turnrl.train.seeds.derive_seed`, by stream name. The task split
(:mod:`turnrl.train.task_split`), the seeds and the guard's names are importable from
here too, as before they had modules of their own.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import warnings
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnrl.io import (
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    naming_write_failures,
    replace_directory,
    truncate_jsonl_steps,
)
from turnrl.train.config import (
    PolicyConfig,
    PPOConfig,
    WarmStartConfig,
    config_to_toml_text,
)
from turnrl.train.run_guard import (
    CONFIG_FILE,
    RunDirectoryError,
    check_creatable,
    check_not_inside,
    check_resumable,
    config_changes,
    holds_run,
    run_entries,
)
from turnrl.train.run_lock import RunLock
from turnrl.train.run_lock import acquire as acquire_lock
from turnrl.train.schedule import due
from turnrl.train.seeds import SEED_STREAMS, derive_seed
from turnrl.train.task_split import TaskSplit, task_split
from turnrl.train.trackers import (
    RunInfo,
    RunTrackers,
    TrackerError,
    source_commit,
    tracker_directory,
)

__all__ = [
    "CONFIG_FILE",
    "METRICS_FILE",
    "SEED_STREAMS",
    "WARM_START_DIR",
    "Checkpoint",
    "RunDirectory",
    "RunDirectoryError",
    "TaskSplit",
    "build_policy",
    "config_changes",
    "derive_seed",
    "due",
    "holds_run",
    "initial_policy",
    "load_policy",
    "task_split",
    "tree_budget",
    "with_lora",
]

METRICS_FILE = "metrics.jsonl"
WARM_START_DIR = "warm_start"


# --------------------------------------------------------------------------- checkpoints


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint (see :mod:`turnrl.train.checkpoint`)."""

    step: int
    model: dict[str, Any]
    optimizer: dict[str, Any] | None
    extra: dict[str, Any]
    """What the trainer saved beside the weights (sampler state, counters...)."""
    rng: dict[str, Any]

    def restore_rng(self) -> None:
        """Restore the global RNGs as they were when saved. Call it last, after
        building every model: building models draws from them."""
        from turnrl.train.checkpoint import restore_rng_state

        restore_rng_state(self.rng)


# --------------------------------------------------------------------------- the run


class RunDirectory:
    """The run directory of one training job and the rules for writing it.

    Build it with :meth:`open` (the guard) before any work; nothing is written until
    :meth:`start`.
    """

    def __init__(
        self,
        path: Path,
        config: Any,
        *,
        resuming: bool,
        clear: bool,
        keep_checkpoints: int,
        quiet: bool,
    ) -> None:
        self.path = path
        self.config = config
        self.resuming = resuming
        """Continue the run found in the directory (from its last checkpoint, if any)."""
        self._clear = clear
        self.keep_checkpoints = keep_checkpoints
        self.quiet = quiet
        self.started = False
        self._lock: RunLock | None = None
        self._identity: tuple[int, int] | None = None
        """``(st_dev, st_ino)`` of the directory once started (to notice its deletion)."""
        self._release: weakref.finalize | None = None
        logging = _logging(config)
        self.trackers = RunTrackers(logging.trackers if logging is not None else [])
        """``logging.trackers``, started by :meth:`start`, finished by :meth:`close`."""

    def _hold(self, lock: RunLock) -> None:
        """Keep ``lock`` until :meth:`close` or until this object is gone."""
        self._lock = lock
        self._release = weakref.finalize(self, lock.release)

    def close(self) -> None:
        """Release the run directory's lock (it is also released when this object is
        garbage-collected, and by the kernel when the process ends); finish the
        trackers first."""
        self.trackers.finish()
        if self._release is not None:
            self._release()

    @classmethod
    def open(
        cls,
        config: Any,
        *,
        resume: bool = False,
        overwrite: bool = False,
        keep_checkpoints: int = 2,
        quiet: bool = False,
        split_over_ranks: bool = False,
    ) -> RunDirectory:
        """Check that ``config.run_dir`` may be used as asked; reads only.

        * missing or empty: a new run (``resume`` then starts fresh too);
        * holds a run (``config.toml``): refused, unless ``resume`` (the run's config
          must equal ``config`` except in ``type(config).MAY_CHANGE_ON_RESUME``) or
          ``overwrite`` (emptied by :meth:`start`);
        * anything else (a file, a non-empty directory without a run): refused.

        Under torchrun with several ranks, only a trainer that splits over them
        (``split_over_ranks``; rank 0 alone writes) may open it: N copies of a
        one-process trainer would write one directory N times.

        Raises :class:`RunDirectoryError` naming the directory and what to do.
        """
        from turnrl.train.distributed import world_from_env

        world = world_from_env()
        if world.split and not split_over_ranks:
            raise RunDirectoryError(
                f"this trainer runs as one process, but torchrun started {world.size} ranks "
                f"that would all write run_dir {config.run_dir}; launch it without torchrun "
                "(docs/distributed.md says what runs on ranks)"
            )
        if resume and overwrite:
            raise RunDirectoryError("--resume and --overwrite exclude each other")
        path = Path(config.run_dir)
        if path.exists() and not path.is_dir():
            raise RunDirectoryError(f"run_dir {path} exists and is not a directory")
        if not path.exists():
            check_creatable(path)
            return cls(
                path,
                config,
                resuming=False,
                clear=False,
                keep_checkpoints=keep_checkpoints,
                quiet=quiet,
            )
        if world.split and not world.main:  # rank 0 holds the lock for every rank
            return cls._open_existing(path, config, resume, overwrite, keep_checkpoints, quiet)
        lock = acquire_lock(path)  # first: a second process is refused before anything else
        try:
            run = cls._open_existing(path, config, resume, overwrite, keep_checkpoints, quiet)
        except BaseException:
            lock.release()
            raise
        run._hold(lock)
        return run

    @classmethod
    def _open_existing(
        cls,
        path: Path,
        config: Any,
        resume: bool,
        overwrite: bool,
        keep_checkpoints: int,
        quiet: bool,
    ) -> RunDirectory:
        """The guard's rules for a directory that exists (see :meth:`open`)."""
        resuming = False
        if run_entries(path):
            if not holds_run(path):
                raise RunDirectoryError(
                    f"run_dir {path} is not empty and holds no turnrl run (no {CONFIG_FILE}); "
                    "refusing to write into it: choose another run_dir"
                )
            if resume:
                check_resumable(path, config)
                resuming = True
            elif not overwrite:
                raise RunDirectoryError(
                    f"run_dir {path} holds a run ({CONFIG_FILE}); give --resume to continue "
                    "it, --overwrite to replace it, or another run_dir"
                )
            else:
                check_not_inside(path, getattr(config, "warm_start", None))
        return cls(
            path,
            config,
            resuming=resuming,
            clear=overwrite and path.is_dir(),
            keep_checkpoints=keep_checkpoints,
            quiet=quiet,
        )

    # ------------------------------------------------------------------ start
    def start(self) -> Checkpoint | None:
        """Begin writing: create (or, under ``overwrite``, empty) the directory; when
        resuming, load the newest good checkpoint and check the warm start (both in
        full, before anything is written: :meth:`load_checkpoint`,
        :meth:`check_warm_start`); write ``config.toml``, and when resuming cut
        ``metrics.jsonl`` back to the checkpoint's step. Returns that checkpoint, or None for a
        fresh start (then an old ``metrics.jsonl`` of a run killed before its first
        checkpoint is removed: its steps are redone)."""
        with naming_write_failures(self.path):
            self.path.mkdir(parents=True, exist_ok=True)
        if self._lock is None:
            self._hold(acquire_lock(self.path))
        if self._clear:
            for entry in run_entries(self.path):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        # A resumed run checks its checkpoint and warm start in full before writing.
        checkpoint = self.load_checkpoint() if self.resuming else None
        if checkpoint is not None and self.has_warm_start:
            self.check_warm_start()
        atomic_write_text(self.path / CONFIG_FILE, config_to_toml_text(self.config))
        info = os.stat(self.path)
        self._identity = (info.st_dev, info.st_ino)
        self.started = True
        if checkpoint is None:
            self.metrics_path.unlink(missing_ok=True)
        elif self.metrics_path.exists():
            truncate_jsonl_steps(self.metrics_path, checkpoint.step)
        self.start_trackers(None if checkpoint is None else checkpoint.step)
        return checkpoint

    def start_trackers(self, resumed_after: int | None) -> None:
        """Start ``logging.trackers`` (before any training work): one that fails is a
        :class:`~turnrl.train.trackers.TrackerError` naming it (exit code 2)."""
        logging = _logging(self.config)
        if logging is None or not logging.trackers:
            return
        config = dataclasses.asdict(self.config)
        info = RunInfo(
            run_dir=self.path,
            name=getattr(self.config, "label", None) or self.path.name,
            project=logging.project,
            config=config,
            commit=source_commit(),
            offline=logging.offline,
            resumed_after=resumed_after,
        )
        try:
            self.trackers.start(info)
        except TrackerError as err:
            raise TrackerError(
                f"{err}; run_dir {self.path} holds no step yet: rerun with --resume once fixed"
            ) from err.__cause__
        where = ", ".join(f"{n} -> {self.path / tracker_directory(n)}" for n in logging.trackers)
        self.log(f"trackers: {where}")

    # ---------------------------------------------------------------- metrics
    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    def append_metrics(self, row: Mapping[str, Any]) -> None:
        """Append one metrics row (it needs a ``step``), crash-safely."""
        if "step" not in row:
            raise ValueError("a metrics row needs a 'step'")
        self.check_present()
        append_jsonl(self.metrics_path, dict(row))
        self.trackers.log(int(row["step"]), row)
        if row["step"] == 0 and not sys.stdout.isatty():  # the plain log's warm-start line
            keys = ("eval_success", "eval_return", "success", "return")
            shown = ", ".join(f"{k} {row[k]:.3f}" for k in keys if k in row)
            self.log(f"step 0 (the warm start's evaluation): {shown or 'written'}")

    def check_present(self) -> None:
        """Refuse to write on when the run directory was deleted (or replaced) since
        :meth:`start`: writing would recreate a directory holding only later steps."""
        if self._identity is None:
            return
        try:
            info = os.stat(self.path)
        except OSError:
            info = None
        if info is None or (info.st_dev, info.st_ino) != self._identity:
            raise RunDirectoryError(
                f"run_dir {self.path} was deleted or replaced while the run was running; "
                "stopped without writing more"
            )

    # ------------------------------------------------------------ checkpoints
    def save_checkpoint(
        self,
        step: int,
        model_state: dict[str, Any],
        optimizer_state: dict[str, Any] | None,
        extra: dict[str, Any] | None = None,
    ) -> Path:
        """Write the checkpoint of ``step`` atomically (RNG states captured now: call it
        right after finishing the step); keeps the newest ``keep_checkpoints``."""
        from turnrl.train.checkpoint import save_checkpoint

        self.check_present()
        return save_checkpoint(
            self.path,
            step,
            model_state,
            optimizer_state,
            extra,
            keep_last=self.keep_checkpoints,
        )

    def load_checkpoint(self) -> Checkpoint | None:
        """The newest checkpoint a run can resume from, or None when there is none.

        Every checkpoint is checked in full before it is used
        (:func:`turnrl.train.checkpoint.payload_problem`); a damaged or foreign newest
        one is skipped for the newest good one, said in one line on stderr."""
        from turnrl.train.checkpoint import load_latest_checkpoint

        try:
            with warnings.catch_warnings(record=True) as skipped:  # said below, or not at all
                warnings.simplefilter("always")
                payload = load_latest_checkpoint(self.path, resumable=True)
        except ValueError as err:
            tried = " ".join(str(err).splitlines()[1:]) or str(err)
            raise RunDirectoryError(
                f"cannot resume {self.path}: no readable checkpoint ({tried}); remove the "
                "damaged files to resume from an earlier checkpoint, or use --overwrite"
            ) from None
        if payload is None:
            return None
        for warning in skipped:  # an older checkpoint is used: say why, one line each
            print(
                f"turnrl: resuming {self.path} from step {payload['step']}: {warning.message}",
                file=sys.stderr,
                flush=True,
            )
        return Checkpoint(
            step=int(payload["step"]),
            model=payload["model"],
            optimizer=payload["optimizer"],
            extra=payload["extra"],
            rng=payload["rng"],
        )

    # ------------------------------------------------------------- warm start
    @property
    def warm_start_dir(self) -> Path:
        return self.path / WARM_START_DIR

    @property
    def has_warm_start(self) -> bool:
        """Whether this run's trainer saves a ``warm_start/`` (every trainer with a
        ``[warm_start]`` section does)."""
        return getattr(self.config, "warm_start", None) is not None

    def warm_start(
        self,
        policy: Any,
        cfg: WarmStartConfig,
        examples: Callable[[], list[Any]],
        *,
        seed: int,
        update: PPOConfig | None = None,
        progress: bool = False,
    ) -> Any:
        """SFT ``policy`` on ``examples()`` for ``cfg.steps`` (unless ``cfg.init_from``
        gave it already, see :func:`initial_policy`, or ``steps`` is 0), save the
        losses and the policy as ``warm_start/``; returns the policy.

        The warm start lays out its batches as the run's PPO ``update`` does (packed into
        trees of ``max_tokens_per_batch`` when it is ``"tree"``, else per row).
        ``progress`` shows a bar (unless ``quiet``); a stdout that is not a terminal gets
        one plain line per step either way."""
        from turnrl.policy.memory_savers import configured_memory_savers
        from turnrl.train.update.sft import supervised_warm_start

        if cfg.init_from is None and cfg.steps > 0:
            train_examples = examples()
            progress = progress or not sys.stdout.isatty()  # a log gets its plain lines
            savers = configured_memory_savers(policy, update)  # as the update's
            with self.progress(enabled=progress) as bar, savers:
                task = bar.add_task("warm start", total=cfg.steps)
                losses = supervised_warm_start(
                    policy,
                    train_examples,
                    steps=cfg.steps,
                    lr=cfg.lr,
                    batch_size=cfg.batch_size,
                    seed=seed,
                    progress=(bar, task) if progress else None,
                    max_tokens_per_batch=tree_budget(update),
                    lr_schedule=cfg.lr_schedule,
                )
            atomic_write_json(self.path / "warm_start_losses.json", losses)
        self.check_present()
        with replace_directory(self.warm_start_dir) as directory:
            policy.save(directory)
        return policy

    def load_warm_start(self) -> Any:
        """The saved warm-start policy (to resume, or as a frozen reference), on the
        config's device and in its precision; a missing or damaged ``warm_start/`` is
        a :class:`RunDirectoryError` naming it (:meth:`check_warm_start`)."""
        self.check_warm_start()
        return load_policy(self.warm_start_dir, getattr(self.config, "policy", None))

    def check_warm_start(self) -> None:
        """Refuse a ``warm_start/`` a resumed run cannot load (deleted, or a file cut
        short): its weights' headers must cover each file (``safetensors`` checks that
        when it opens one), its ``config.json`` must parse. Called by :meth:`start`
        before a resumed run changes anything."""
        from turnrl.train.checkpoint import warm_start_problem

        problem = warm_start_problem(self.warm_start_dir)
        if problem is not None:
            raise RunDirectoryError(
                f"cannot resume {self.path}: {problem}; a resumed run needs the warm start "
                "it began from: use --overwrite to start the run again"
            )

    # ------------------------------------------------------------------ export
    @property
    def export_every(self) -> int:
        """``train.export_every`` of the run's config (0, never, for a config without it:
        ``turnrl iterate`` saves every iteration's policy already)."""
        return int(getattr(getattr(self.config, "train", None), "export_every", 0) or 0)

    def export_policy(self, step: int, *, final: bool = False) -> Path:
        """Export checkpoint ``step`` as a Hugging Face model directory
        (:mod:`turnrl.train.export`): to ``policy/step-N/``, or with ``final`` to
        ``policy/`` itself (its ``step-N/`` exports kept). Returns the directory."""
        from turnrl.train.export import EXPORT_DIR, export_run, step_export_name

        self.check_present()
        out = self.path / EXPORT_DIR
        if not final:
            out = out / step_export_name(step)
        written, _ = export_run(
            self.path,
            out,
            warm_start=self.warm_start_dir,
            step=step,
            overwrite=True,
            keep_step_exports=final,
        )
        return written

    # ----------------------------------------------------------------- output
    def progress(self, *, enabled: bool = True) -> Any:
        """A rich progress bar on a terminal, one plain line per phase and step otherwise
        (:func:`turnrl.train.progress.progress_display`); silent when ``quiet`` or not
        ``enabled``."""
        from turnrl.train.progress import progress_display

        return progress_display(disable=self.quiet or not enabled)

    def log(self, message: str) -> None:
        """One line on stdout, unless ``quiet``."""
        if not self.quiet:
            print(message, flush=True)


def _logging(config: Any) -> Any:
    """The config's ``[logging]`` section (None for a config without one)."""
    return getattr(config, "logging", None)


# --------------------------------------------------------------------------- models, tasks
# Building and loading policies lives in turnrl.policy.factory (the trainer, `turnrl serve`
# and the Ray workers share it); these names stay for the trainers that import them here.
# Imported when called: this module loads without torch.


def with_lora(policy: Any, config: PolicyConfig) -> Any:
    """``policy`` with fresh LoRA adapters if ``config.lora_rank > 0`` and it has none yet."""
    from turnrl.policy import factory

    return factory.with_lora(policy, config)


def load_policy(path: str | Path, config: PolicyConfig | None) -> Any:
    """A saved policy directory, on ``config.device`` in ``config.dtype`` (CPU, float32
    without a config)."""
    from turnrl.policy import factory

    return factory.load_policy(path, config)


def build_policy(config: PolicyConfig, seed: int) -> Any:
    """The learner ``config`` names (see :func:`turnrl.policy.factory.build_policy`)."""
    from turnrl.policy import factory

    return factory.build_policy(config, seed)


def initial_policy(policy: Any, warm: WarmStartConfig, config: PolicyConfig) -> Any:
    """The policy a fresh run starts from: ``warm.init_from`` (a saved policy, e.g.
    another run's ``warm_start/``, with LoRA as configured) when set, else ``policy``."""
    from turnrl.policy import factory

    return factory.initial_policy(policy, warm.init_from, config)


def tree_budget(update: PPOConfig | None) -> int | None:
    """The token budget of one packed batch when ``update`` lays rows out as trees
    (``update = "tree"``), else None (one row per sequence; also without a PPO config)."""
    if update is None or update.update != "tree":
        return None
    return update.max_tokens_per_batch
