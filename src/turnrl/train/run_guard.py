"""The run-directory guard's rules: which directory a run may use, and when a resumed
run's config may differ from the one it was started with (see
:meth:`turnrl.train.run.RunDirectory.open`). Reads only; nothing here writes."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from turnrl.errors import OutputError, UsageError
from turnrl.io import WRITE_FAILURES
from turnrl.train.config import WarmStartConfig, config_to_dict, load_config
from turnrl.train.run_lock import LOCK_FILE

CONFIG_FILE = "config.toml"
"""Every trainer writes it first: a directory holds a run when it has one."""


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


def check_resumable(path: Path, config: Any) -> None:
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
    check_steps_not_fewer(path, config)


def check_steps_not_fewer(path: Path, config: Any) -> None:
    """Refuse to resume with fewer steps than the run's newest checkpoint has done (the
    config class names its step count in ``STEPS_KEY``): nothing would run, and the
    saved ``config.toml`` would claim a shorter run than its metrics hold."""
    from turnrl.train.checkpoint import list_checkpoints

    key = getattr(type(config), "STEPS_KEY", None)
    saved = list_checkpoints(path)
    if key is None or not saved:
        return
    steps = config
    for part in key.split("."):
        steps = getattr(steps, part)
    done, newest = saved[-1]
    if steps < done:
        raise RunDirectoryError(
            f"cannot resume {path}: {key} = {steps} is fewer than the {done} steps it has "
            f"done ({newest.name}); give {key} >= {done}, or use another run_dir"
        )


def check_not_inside(path: Path, warm: WarmStartConfig | None) -> None:
    """Refuse to empty a run directory that holds the policy the new run starts from."""
    source = None if warm is None else warm.init_from
    if source is not None and Path(source).resolve().is_relative_to(path.resolve()):
        raise RunDirectoryError(
            f"--overwrite would delete warm_start.init_from = {source!r}, which lies inside "
            f"run_dir {path}; copy it elsewhere first or use another run_dir"
        )
