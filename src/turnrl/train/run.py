"""One run's lifecycle, shared by every trainer (``turnrl train``, ``turnrl iterate``,
the agent loop): the run directory and everything a trainer does with it that is not
its own algorithm.

A trainer uses it in this order::

    validate(config)                                  # turnrl.train.validate: no work yet
    run = RunDirectory.open(config, resume=..., overwrite=...)   # the guard: reads only
    tasks = task_split(config.env)                    # train / eval tasks
    torch.manual_seed(config.seed); policy = build_policy(config.policy, seed)
    checkpoint = run.start()                          # first write: config.toml
    if checkpoint is None:                            # a fresh run
        policy = initial_policy(policy, config.warm_start, config.policy)
        policy = run.warm_start(policy, config.warm_start, examples, seed=seed)
        run.append_metrics({"step": 0, **evaluate()})
    else:                                             # resuming after checkpoint.step
        policy = run.load_warm_start()
        policy.load_state_dict(checkpoint.model); optimizer.load_state_dict(...)
        checkpoint.restore_rng()                      # last: building models draws from it
    with run.progress() as bar:
        ... one step ... run.append_metrics(row); run.save_checkpoint(step, ...)

The guard is the data-loss rule: a directory that holds a run (it has a
``config.toml``) is never written by another run. ``RunDirectory.open`` refuses it
unless ``resume`` (and then only if the config differs from the run's
``config.toml`` in nothing but the fields the config class lists in
``MAY_CHANGE_ON_RESUME``) or ``overwrite`` (the directory is emptied when the run
starts). A non-empty directory that holds no run is refused always: it is not ours
to empty. Nothing is written before :meth:`RunDirectory.start` but the lock.

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

Seeds: every random stream of a run derives from the config's seed through
:func:`derive_seed`, by stream name, so no two trainers invent their own arithmetic.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import warnings
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from turnrl.errors import OutputError, UsageError
from turnrl.io import (
    WRITE_FAILURES,
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    naming_write_failures,
    replace_directory,
    truncate_jsonl_steps,
)
from turnrl.train.config import (
    EnvConfig,
    PolicyConfig,
    PPOConfig,
    WarmStartConfig,
    config_to_dict,
    config_to_toml_text,
    load_config,
)
from turnrl.train.run_lock import LOCK_FILE, RunLock
from turnrl.train.run_lock import acquire as acquire_lock
from turnrl.types import Task

CONFIG_FILE = "config.toml"
METRICS_FILE = "metrics.jsonl"
WARM_START_DIR = "warm_start"

# --------------------------------------------------------------------------- seeds

SEED_STREAMS: dict[str, tuple[int, int]] = {
    "rollout": (1_000_003, 0),
    "update": (100_003, 0),
    "eval_tasks": (1, 7919),
    "deploy_arm": (31, 0),
    "q_fit": (1009, 0),
    "improve": (1_000_033, 0),
    "improve_sample": (7919, 0),
    "improve_probe": (1, -1),
}
"""Random streams of a run: ``name -> (multiplier, offset)``; see :func:`derive_seed`.

``rollout``: a training step's sampling (index: the step or iteration); ``update``:
the mini-batch order of an update (index: the step); ``eval_tasks``: the held-out
task set (from ``env.seed``); ``deploy_arm``: one (temperature, persona) arm of an
Iterative GRPO deployment; ``q_fit``: Q's initialisation and split; ``improve``:
an improvement step's task draws, ``improve_sample`` its candidate sampling and
``improve_probe`` its probe set. A new stream is a new entry here, whose
``(multiplier, offset)`` no other stream has."""


def derive_seed(base: int, stream: str, index: int = 0) -> int:
    """The seed of ``stream`` at ``index`` (a step, an iteration, an arm) for a run
    seeded ``base``: ``base * multiplier + offset + index``.

    Multipliers are distinct primes (or small constants kept from the first
    trainers, so their numbers never changed), which keeps streams of one run apart
    for any realistic number of steps.
    """
    try:
        multiplier, offset = SEED_STREAMS[stream]
    except KeyError:
        raise ValueError(
            f"unknown seed stream {stream!r}; known: {', '.join(sorted(SEED_STREAMS))}"
        ) from None
    return base * multiplier + offset + index


# --------------------------------------------------------------------------- guard


class RunDirectoryError(UsageError):
    """A run directory may not be used as asked (it holds another run, the config of a
    resumed run changed, ...). Raised before anything is written."""


def holds_run(path: Path) -> bool:
    """Whether ``path`` holds a run: every trainer writes ``config.toml`` first."""
    return (path / CONFIG_FILE).is_file()


def run_entries(path: Path) -> list[Path]:
    """What a directory holds, but the run lock file (which is no content)."""
    return [entry for entry in path.iterdir() if entry.name != LOCK_FILE]


def check_creatable(path: Path) -> None:
    """Refuse, before any work, a missing run directory that cannot be created: its
    nearest existing ancestor must take a new entry (tried with an empty temporary
    file, removed at once: ``os.access`` approves a read-only file system for root)."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"run_dir {path}: cannot create it: {parent} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".turnrl-probe-")
    except OSError as err:
        why = WRITE_FAILURES.get(err.errno or 0, err.strerror)
        raise OutputError(f"run_dir {path}: cannot create it in {parent} ({why})") from None
    os.close(fd)
    os.unlink(probe)


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a nested dict (``{"train": {"seed": 0}}`` -> ``{"train.seed": 0}``)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}{key}."))
        if not value and prefix:
            out[prefix[:-1]] = {}
        return out
    return {prefix[:-1]: value}


def config_changes(old: Any, new: Any, may_change: tuple[str, ...]) -> list[str]:
    """``key (old -> new)`` for every dotted key where two configs of one class differ,
    except keys in (or under) ``may_change``."""
    before, after = _flatten(config_to_dict(old)), _flatten(config_to_dict(new))
    changes = []
    missing = object()
    for key in sorted(set(before) | set(after)):
        if any(key == allowed or key.startswith(allowed + ".") for allowed in may_change):
            continue
        a, b = before.get(key, missing), after.get(key, missing)
        if a != b or type(a) is not type(b):
            shown = ["(unset)" if v is missing else repr(v) for v in (a, b)]
            changes.append(f"{key} ({shown[0]} -> {shown[1]})")
    return changes


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


@dataclass(frozen=True)
class TrainingStart:
    """What :meth:`RunDirectory.start_training` hands a trainer."""

    policy: Any
    reference: Any | None
    """Frozen warm start for the KL penalty (``None`` when ``train.kl_coef`` is 0)."""
    optimizer: Any
    checkpoint: Checkpoint | None
    """The checkpoint resumed from (``None``: a fresh run)."""


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

    def _hold(self, lock: RunLock) -> None:
        """Keep ``lock`` until :meth:`close` or until this object is gone."""
        self._lock = lock
        self._release = weakref.finalize(self, lock.release)

    def close(self) -> None:
        """Release the run directory's lock (it is also released when this object is
        garbage-collected, and by the kernel when the process ends)."""
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
                _check_resumable(path, config)
                resuming = True
            elif not overwrite:
                raise RunDirectoryError(
                    f"run_dir {path} holds a run ({CONFIG_FILE}); give --resume to continue "
                    "it, --overwrite to replace it, or another run_dir"
                )
            else:
                _check_not_inside(path, getattr(config, "warm_start", None))
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
        """Begin writing: create (or, under ``overwrite``, empty) the directory, write
        ``config.toml``, and when resuming load the newest checkpoint and cut
        ``metrics.jsonl`` back to its step. Returns that checkpoint, or None for a
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
        atomic_write_text(self.path / CONFIG_FILE, config_to_toml_text(self.config))
        info = os.stat(self.path)
        self._identity = (info.st_dev, info.st_ino)
        self.started = True
        checkpoint = self.load_checkpoint() if self.resuming else None
        if checkpoint is None:
            self.metrics_path.unlink(missing_ok=True)
        elif self.metrics_path.exists():
            truncate_jsonl_steps(self.metrics_path, checkpoint.step)
        return checkpoint

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
        """The newest readable checkpoint, or None when there is none."""
        from turnrl.train.checkpoint import load_latest_checkpoint

        try:
            with warnings.catch_warnings(record=True) as skipped:  # said below, or not at all
                warnings.simplefilter("always")
                payload = load_latest_checkpoint(self.path)
        except ValueError as err:
            tried = " ".join(str(err).splitlines()[1:]) or str(err)
            raise RunDirectoryError(
                f"cannot resume {self.path}: no readable checkpoint ({tried}); remove the "
                "damaged files to resume from an earlier checkpoint, or use --overwrite"
            ) from None
        for warning in skipped:  # an older checkpoint is used: say why
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
        if payload is None:
            return None
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

    def warm_start(
        self,
        policy: Any,
        cfg: WarmStartConfig,
        examples: Callable[[], list[Any]],
        *,
        seed: int,
        progress: bool = False,
    ) -> Any:
        """SFT ``policy`` on ``examples()`` for ``cfg.steps`` (unless ``cfg.init_from``
        gave it already, see :func:`initial_policy`, or ``steps`` is 0), save the
        losses and the policy as ``warm_start/``; returns the policy.

        ``progress`` shows a bar (unless ``quiet``)."""
        from turnrl.train.sft import supervised_warm_start

        if cfg.init_from is None and cfg.steps > 0:
            train_examples = examples()
            with self.progress(enabled=progress) as bar:
                task = bar.add_task("warm start", total=cfg.steps)
                losses = supervised_warm_start(
                    policy,
                    train_examples,
                    steps=cfg.steps,
                    lr=cfg.lr,
                    batch_size=cfg.batch_size,
                    seed=seed,
                    progress=(bar, task) if progress else None,
                    max_tokens_per_batch=self._tree_budget(),
                    lr_schedule=cfg.lr_schedule,
                )
            atomic_write_json(self.path / "warm_start_losses.json", losses)
        self.check_present()
        with replace_directory(self.warm_start_dir) as directory:
            policy.save(directory)
        return policy

    def _tree_budget(self) -> int | None:
        """The warm start lays out its batches as the run's update does: the PPO section's
        ``max_tokens_per_batch`` when its ``update`` is ``"tree"``, else per row."""
        for value in vars(self.config).values() if dataclasses.is_dataclass(self.config) else ():
            if isinstance(value, PPOConfig):
                return value.max_tokens_per_batch if value.update == "tree" else None
        return None

    def start_training(
        self,
        policy: Any,
        config: Any,
        demonstrations: Callable[[], list[Any]],
        sampler: np.random.Generator,
    ) -> TrainingStart:
        """Start or resume an RL run from a ``RunConfig``-shaped ``config``.

        A fresh run warm-starts ``policy`` (:func:`initial_policy`, then
        :meth:`warm_start` on ``demonstrations()``); a resumed one reloads the saved
        warm start and then the last checkpoint's weights, optimiser state, ``sampler``
        state and global RNGs. The frozen KL reference (the warm start, when
        ``train.kl_coef > 0``) and the AdamW optimiser are built the same way in both
        cases. The checkpoint's other ``extra`` counters are the caller's to read.
        """
        import torch

        checkpoint = self.start()
        if checkpoint is None:
            policy = initial_policy(policy, config.warm_start, config.policy)
            policy = self.warm_start(
                policy, config.warm_start, demonstrations, seed=config.train.seed, progress=True
            )
        else:
            policy = self.load_warm_start()
        reference = self.load_warm_start().clone_frozen() if config.train.kl_coef > 0 else None
        optimizer = torch.optim.AdamW(policy.parameters(), lr=config.train.lr, weight_decay=0.0)
        if checkpoint is not None:
            policy.load_state_dict(checkpoint.model)
            assert checkpoint.optimizer is not None  # RL checkpoints always carry one
            optimizer.load_state_dict(checkpoint.optimizer)
            sampler.bit_generator.state = checkpoint.extra["sampler"]
            checkpoint.restore_rng()  # after building models, which draw from it
        return TrainingStart(policy, reference, optimizer, checkpoint)

    def load_warm_start(self) -> Any:
        """The saved warm-start policy (to resume, or as a frozen reference), on the
        config's device and in its precision."""
        return load_policy(self.warm_start_dir, getattr(self.config, "policy", None))

    # ----------------------------------------------------------------- output
    def progress(self, *, enabled: bool = True) -> Any:
        """A rich progress display (silent when ``quiet`` or not ``enabled``)."""
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        return Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            disable=self.quiet or not enabled,
            transient=False,
        )

    def log(self, message: str) -> None:
        """One line on stdout, unless ``quiet``."""
        if not self.quiet:
            print(message, flush=True)


def _check_resumable(path: Path, config: Any) -> None:
    """Refuse to resume the run in ``path`` with a config that changed where it may not."""
    cls = type(config)
    try:
        saved = load_config(cls, path / CONFIG_FILE, saved_copy=True)
    except (OSError, ValueError) as err:
        raise RunDirectoryError(f"cannot resume: {err}") from None
    allowed = tuple(getattr(cls, "MAY_CHANGE_ON_RESUME", ()))
    changes = config_changes(saved, config, allowed)
    if changes:
        raise RunDirectoryError(
            f"cannot resume {path}: the config differs from its {CONFIG_FILE} in "
            f"{'; '.join(changes)}. Only {', '.join(allowed) or 'nothing'} may change on "
            "resume; use another run_dir, or --overwrite to replace the run"
        )


def _check_not_inside(path: Path, warm: WarmStartConfig | None) -> None:
    """Refuse to empty a run directory that holds the policy the new run starts from."""
    source = None if warm is None else warm.init_from
    if source is not None and Path(source).resolve().is_relative_to(path.resolve()):
        raise RunDirectoryError(
            f"--overwrite would delete warm_start.init_from = {source!r}, which lies inside "
            f"run_dir {path}; copy it elsewhere first or use another run_dir"
        )


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


@dataclass(frozen=True)
class TaskSplit:
    """A run's fixed training task pool and its held-out evaluation tasks."""

    train: list[Task]
    eval: list[Task]

    @property
    def eval_unseen(self) -> float:
        """Share of evaluation tasks not in the training pool (small pools overlap)."""
        train_ids = {t.task_id for t in self.train}
        return float(np.mean([t.task_id not in train_ids for t in self.eval]))


def task_split(env: EnvConfig) -> TaskSplit:
    """Training tasks from ``env.seed``, evaluation tasks from a derived seed. Small
    pools (the calculator's easy problems) overlap: ``TaskSplit.eval_unseen`` says
    how much."""
    from turnrl.envs import make_tasks

    return TaskSplit(
        train=make_tasks(env.name, env.n_train_tasks, env.seed, **env.task_kwargs),
        eval=make_tasks(
            env.name, env.n_eval_tasks, derive_seed(env.seed, "eval_tasks"), **env.task_kwargs
        ),
    )


def due(step: int, every: int) -> bool:
    """Whether a periodic action (``every`` steps; 0 = never) falls on ``step``."""
    return every > 0 and step % every == 0
