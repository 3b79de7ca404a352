"""A trained policy from disk, for use outside its run (``turnrl eval``).

Two kinds of directory are accepted:

* a **run directory** (``turnrl train``'s ``run_dir``: it holds ``warm_start/``): the
  policy as its last checkpoint left it, built as a resumed run builds it (the saved
  warm start, then the checkpoint's weights; :func:`~turnrl.train.policy_start.
  start_training`), so its weights are the learner's at that step, bit for bit. A run
  without a checkpoint yet gives its warm start;
* a **policy directory**: a Hugging Face model directory (``config.json``; ``turnrl
  export``'s output, a run's ``policy/`` or ``warm_start/``)
  or LoRA adapters (``adapter_config.json``), loaded by the policy factory.

Both are placed on ``policy.device`` in ``policy.dtype`` of the settings given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnrl.errors import UsageError
from turnrl.serve.cli import MODEL_FILES

__all__ = ["SavedPolicy", "load_saved_policy"]


@dataclass(frozen=True)
class SavedPolicy:
    """A loaded policy and where it came from."""

    policy: Any
    source: str
    """What was loaded, in words (``runs/x checkpoint step 40``, ``export/``)."""
    step: int | None
    """The checkpoint's step for a run directory (0: its warm start); None otherwise."""


def is_policy_directory(path: Path) -> bool:
    """Whether ``path`` holds a saved model or LoRA adapters."""
    return any((path / name).is_file() for name in MODEL_FILES)


def load_saved_policy(path: str | Path, settings: Any, *, option: str = "--policy") -> SavedPolicy:
    """The policy saved in ``path`` (a run directory or a policy directory, see the
    module docstring) with ``settings`` (``PolicyConfig``'s fields) for its device and
    precision; ``option`` names the input in errors (a :class:`UsageError`)."""
    from turnrl.policy import factory
    from turnrl.train.checkpoint import load_latest_checkpoint
    from turnrl.train.run import WARM_START_DIR

    directory = Path(path)
    if not directory.is_dir():
        raise UsageError(f"{option}: {path} is not a directory")
    warm_start = directory / WARM_START_DIR
    if is_policy_directory(warm_start):
        policy = factory.load_policy(warm_start, settings)
        try:
            payload = load_latest_checkpoint(directory)
        except ValueError as err:  # checkpoint files exist, none readable
            raise UsageError(f"{option}: {path}: {err}") from None
        if payload is None:
            return SavedPolicy(policy, f"{directory} (warm start, no checkpoint)", 0)
        policy.load_state_dict(payload["model"])
        step = int(payload["step"])
        return SavedPolicy(policy, f"{directory} (checkpoint step {step})", step)
    if is_policy_directory(directory):
        return SavedPolicy(factory.load_policy(directory, settings), str(directory), None)
    raise UsageError(
        f"{option}: {path} is neither a run directory (no {WARM_START_DIR}/ policy) nor a "
        f"policy directory (no {' or '.join(MODEL_FILES)})"
    )
