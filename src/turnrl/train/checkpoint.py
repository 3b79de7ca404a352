"""Crash-safe training checkpoints with RNG state, for exact resumption.

Layout inside a run directory::

    checkpoints/step-000050.pt    one payload per saved step (torch.save, written atomically)
    checkpoints/latest            text: the file name of the newest complete checkpoint

A checkpoint file appears only once fully written (temp file + fsync + ``os.replace``),
and ``latest`` is replaced only after it, so a crash at any moment leaves the previous
checkpoint usable; stray ``*.tmp`` files are never read. If the file ``latest`` names is
missing, unreadable or damaged anyway (disk trouble, a file copied from elsewhere: a step
other than its name's, no optimiser state, no ``extra.sampler``; :func:`payload_problem`),
loading warns and falls back to the newest good ``step-*.pt``: every check runs before a
resumed run changes anything.

The payload holds the model and optimizer state dicts, the step, a free-form ``extra``
dict, and the RNG states of Python ``random``, NumPy's global generator, torch (CPU and,
when present, CUDA). Everything is stored as tensors and plain Python values, so files
load with ``torch.load(weights_only=True)``: loading a checkpoint never runs pickled
code. ``extra`` must therefore hold only tensors, numbers, strings, bools, None, lists,
tuples and dicts of those (NumPy generators: store ``rng.bit_generator.state``).
"""

from __future__ import annotations

import random
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from turnrl.io import atomic_open, atomic_write_text

CHECKPOINT_DIR = "checkpoints"
LATEST = "latest"
_NAME = re.compile(r"^step-(\d+)\.pt$")
FORMAT_VERSION = 1


def checkpoint_dir(run_dir: str | Path) -> Path:
    """``run_dir/checkpoints``."""
    return Path(run_dir) / CHECKPOINT_DIR


def checkpoint_name(step: int) -> str:
    """File name of the checkpoint of ``step`` (``step-000042.pt``)."""
    return f"step-{step:06d}.pt"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoint files of a run as ``(step, path)``, oldest first."""
    directory = checkpoint_dir(run_dir)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match and path.is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


# --------------------------------------------------------------------------- RNG


def capture_rng_state() -> dict[str, Any]:
    """RNG states of Python ``random``, NumPy's global generator and torch (CPU, CUDA)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of ``capture_rng_state``. CUDA states are restored only when the number
    of visible devices matches (otherwise a warning: resuming on other hardware)."""
    random.setstate(_as_python_state(state["python"]))
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["kind"],
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    cuda_states = state.get("cuda")
    if cuda_states is not None:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(cuda_states):
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            warnings.warn(
                "checkpoint has CUDA RNG states for a different device setup; not restored",
                stacklevel=2,
            )


def _as_python_state(value: Any) -> Any:
    """``random.setstate`` needs tuples; be robust to lists after serialisation."""
    if isinstance(value, list):
        return tuple(_as_python_state(v) for v in value)
    if isinstance(value, tuple):
        return tuple(_as_python_state(v) for v in value)
    return value


# --------------------------------------------------------------------------- save / load


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model_state: dict[str, Any],
    optimizer_state: dict[str, Any] | None,
    extra: dict[str, Any] | None = None,
    *,
    keep_last: int | None = 2,
) -> Path:
    """Write ``checkpoints/step-XXXXXX.pt`` atomically, point ``latest`` at it, and
    delete all but the ``keep_last`` newest checkpoints (None keeps all).

    RNG states are captured here, at call time: save right after finishing a step so
    that resuming continues the same random streams. Returns the checkpoint path.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
    directory = checkpoint_dir(run_dir)
    path = directory / checkpoint_name(step)
    payload = {
        "format": FORMAT_VERSION,
        "step": int(step),
        "model": model_state,
        "optimizer": optimizer_state,
        "extra": dict(extra or {}),
        "rng": capture_rng_state(),
    }
    with atomic_open(path) as handle:
        torch.save(payload, handle)
    atomic_write_text(directory / LATEST, path.name + "\n")
    if keep_last is not None:
        for _, old in list_checkpoints(run_dir)[:-keep_last]:
            if old != path:
                old.unlink(missing_ok=True)
    return path


def load_checkpoint(
    path: str | Path,
    *,
    restore_rng: bool = False,
    map_location: str | torch.device | None = "cpu",
    resumable: bool = False,
) -> dict[str, Any]:
    """Load one checkpoint payload (safely: ``weights_only=True``).

    Returns the dict ``{"format", "step", "model", "optimizer", "extra", "rng"}``;
    with ``restore_rng`` the RNG states are restored too. Raises ``ValueError`` naming
    the file when it is not a readable turnrl checkpoint, or (``resumable``) one a run
    cannot resume from (:func:`payload_problem`: a step other than its name's, no optimiser, no
    ``extra.sampler``...).
    """
    source = Path(path)
    try:
        payload = torch.load(source, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises several types for damaged files
        raise ValueError(f"{source}: unreadable checkpoint ({type(err).__name__}: {err})") from err
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        raise ValueError(f"{source}: not a turnrl checkpoint (format {FORMAT_VERSION})")
    problem = payload_problem(payload, _step_of_name(source.name)) if resumable else None
    if problem is not None:
        raise ValueError(f"{source}: damaged or foreign checkpoint: {problem}")
    if restore_rng:
        restore_rng_state(payload["rng"])
    return payload


def _step_of_name(name: str) -> int | None:
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


def payload_problem(payload: dict[str, Any], step: int | None) -> str | None:
    """What makes a loaded payload unusable to resume from, or None: checked in full
    before a resumed run touches anything (cutting ``metrics.jsonl`` to the step,
    loading weights), so that a damaged or foreign file is skipped for an older one
    instead of failing halfway. ``step`` is the one its file name says (None: any).

    Every trainer saves the weights, an optimiser state, its task sampler's state as
    ``extra["sampler"]`` and the RNG states; the step must be the file name's.
    """
    saved = payload.get("step")
    if not isinstance(saved, int) or isinstance(saved, bool) or saved < 0:
        return f"its step is {saved!r}, not a step number"
    if step is not None and saved != step:
        return f"it holds step {saved}, but its name says step {step}"
    model = payload.get("model")
    if not isinstance(model, dict) or not model:
        return "no model weights"
    if not all(isinstance(k, str) and torch.is_tensor(v) for k, v in model.items()):
        return "the model weights are not a dict of named tensors"
    optimizer = payload.get("optimizer")
    if not isinstance(optimizer, dict) or not {"state", "param_groups"} <= optimizer.keys():
        return "no optimiser state"
    extra = payload.get("extra")
    if not isinstance(extra, dict):
        return "no 'extra' dict"
    sampler = extra.get("sampler")
    if not isinstance(sampler, dict) or not {"bit_generator", "state"} <= sampler.keys():
        return "no task sampler state (extra.sampler)"
    rng = payload.get("rng")
    if not isinstance(rng, dict) or not {"python", "numpy", "torch"} <= rng.keys():
        return "no RNG states"
    return None


def load_latest_checkpoint(
    run_dir: str | Path,
    *,
    restore_rng: bool = False,
    map_location: str | torch.device | None = "cpu",
    resumable: bool = False,
) -> dict[str, Any] | None:
    """The newest checkpoint payload of a run, or None when it has none.

    Tries the file named by ``latest`` first, then the other ``step-*.pt`` newest first,
    warning about each one that cannot be read (or, ``resumable``, resumed from).
    Raises ``ValueError`` only when checkpoint files exist but none is usable.
    """
    directory = checkpoint_dir(run_dir)
    candidates = [path for _, path in reversed(list_checkpoints(run_dir))]
    pointer = directory / LATEST
    if pointer.is_file():
        named = directory / pointer.read_text(encoding="utf-8").strip()
        if named in candidates:
            candidates.remove(named)
            candidates.insert(0, named)
        else:
            warnings.warn(f"{pointer} names missing file {named.name}", stacklevel=2)
    failures = []
    for path in candidates:
        try:
            return load_checkpoint(
                path, restore_rng=restore_rng, map_location=map_location, resumable=resumable
            )
        except ValueError as err:
            failures.append(str(err))
            warnings.warn(f"skipping {err}", stacklevel=2)
    if failures:
        raise ValueError(f"{directory}: no readable checkpoint:\n" + "\n".join(failures))
    return None


# --------------------------------------------------------------------------- warm start


def warm_start_problem(directory: Path) -> str | None:
    """What makes a run's saved warm start (a policy directory) unloadable, or None.

    Checks what loading would trip on, without loading the weights: the directory
    exists, its ``config.json`` (or LoRA ``adapter_config.json``) parses as a JSON
    object, and every ``*.safetensors`` file opens (``safetensors`` checks that its
    header's tensors cover the file exactly: a file cut short fails here).
    """
    import json

    from safetensors import safe_open

    name = f"{directory.name}/ ({directory})"
    if not directory.is_dir():
        return f"its warm start {name} is missing"
    configs = [directory / n for n in ("config.json", "adapter_config.json")]
    present = [path for path in configs if path.is_file()]
    if not present:
        return f"its warm start {name} has no config.json"
    for path in present:
        try:
            parsed = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            return f"its warm start's {path.name} is damaged ({err})"
        if not isinstance(parsed, dict):
            return f"its warm start's {path.name} is damaged (not a JSON object)"
    weights = sorted(directory.glob("*.safetensors"))
    if not weights and not any(directory.glob("*.bin")):
        return f"its warm start {name} holds no weights (*.safetensors)"
    for path in weights:
        try:
            with safe_open(str(path), "pt"):
                pass
        except Exception as err:  # SafetensorError, OSError
            return f"its warm start's {path.name} is damaged ({type(err).__name__}: {err})"
    return None
