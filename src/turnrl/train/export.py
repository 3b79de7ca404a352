"""A run's policy as a Hugging Face model directory (``turnrl export``, a run's ``policy/``).

A checkpoint (``checkpoints/step-N.pt``) holds only what the learner trains: the whole
model's state dict, or only the LoRA adapters' (the frozen base is reloaded from its
source). To use the policy anywhere else it is rebuilt as a resumed run rebuilds it
(the saved ``warm_start/``, then the checkpoint's weights) and written as a directory
that ``transformers.AutoModelForCausalLM.from_pretrained`` and vLLM load as it is
(docs/export.md):

* **merged** (the default): the weights as ``model.safetensors`` with LoRA adapters
  merged into the base (``peft``'s ``merge_and_unload``), ``config.json``,
  ``generation_config.json``;
* **adapters** (``--adapters``, LoRA runs only): peft's ``adapter_config.json`` and
  ``adapter_model.safetensors``; the adapter config names the base model's directory by
  absolute path (a model directory outside the run, e.g. SmolLM2's), or the base is
  written to ``base/`` inside the export (the built-in tiny model's base, which only the
  run's ``warm_start/base`` holds);

and in both the tokenizer (``tokenizer.json``, ``tokenizer_config.json``) with the
chat template (``chat_template.jinja``, and in ``tokenizer_config.json`` for loaders
that read it there) and ``turnrl_export.json`` saying what was exported from where.
The weights keep the run's ``policy.dtype``.

Writes are all or nothing: the directory is written beside its destination under a
temporary name and renamed into place. An existing non-empty destination is refused
unless ``overwrite``.

Every finished run exports its final policy to ``RUN_DIR/policy/`` this way, and
``train.export_every = N`` exports step N to ``RUN_DIR/policy/step-N/``
(:meth:`~turnrl.train.run.RunDirectory.export_policy`); replacing ``policy/`` keeps
those step exports.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnrl.errors import UsageError
from turnrl.io import TMP_SUFFIX, atomic_write_json, naming_write_failures

__all__ = [
    "EXPORT_DIR",
    "MANIFEST",
    "ExportedPolicy",
    "export_run",
    "load_run_policy",
    "step_export_name",
    "write_policy_directory",
]

EXPORT_DIR = "policy"
"""Where a finished run writes its final policy (inside the run directory)."""
MANIFEST = "turnrl_export.json"
"""The export's own record: source run, step, and merged or adapters."""
STEP_PREFIX = "step-"
"""Periodic exports inside ``policy/``: ``step-N``."""


def step_export_name(step: int) -> str:
    """The directory name of the periodic export of ``step`` (``step-40``)."""
    return f"{STEP_PREFIX}{step}"


@dataclass(frozen=True)
class ExportedPolicy:
    """A run's policy at one checkpoint, rebuilt in memory."""

    policy: Any
    """An ``HFPolicy`` on the CPU (LoRA adapters kept as adapters)."""
    step: int
    """The checkpoint's step."""


def run_dtype(run_dir: Path) -> str:
    """The run's ``policy.dtype`` from its ``config.toml`` (``float32`` when unset): the
    precision it trained in, which the export keeps."""
    from turnrl.train.run_guard import CONFIG_FILE

    config_file = run_dir / CONFIG_FILE
    try:
        data = tomllib.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise UsageError(f"{config_file}: cannot read the run's config ({err})") from None
    policy = data.get("policy", {})
    dtype = policy.get("dtype", "float32") if isinstance(policy, dict) else "float32"
    return str(dtype)


def load_run_policy(
    run_dir: str | Path, warm_start: Path, step: int | None = None
) -> ExportedPolicy:
    """The policy of run ``run_dir`` at checkpoint ``step`` (None: its last), on the CPU
    in the run's precision: its saved ``warm_start`` directory with the checkpoint's
    weights loaded, as a resumed run builds it (step 0 without a checkpoint of its own:
    the warm start itself, what a run of ``train.steps = 0`` ends with). A missing
    directory, warm start, checkpoint or step is one :class:`~turnrl.errors.UsageError`
    naming the path and the step. (``warm_start`` is the caller's: this module does not import
    :mod:`turnrl.train.run`, which imports it.)"""
    from turnrl.policy import factory
    from turnrl.train.checkpoint import (
        checkpoint_dir,
        list_checkpoints,
        load_checkpoint,
        load_latest_checkpoint,
    )

    run = Path(run_dir)
    if not run.is_dir():
        raise UsageError(f"{run}: no such run directory")
    if not any((warm_start / name).is_file() for name in ("config.json", "adapter_config.json")):
        raise UsageError(f"{run}: not a turnrl run directory (no saved policy in {warm_start})")
    saved = dict(list_checkpoints(run))
    if step == 0 and 0 not in saved:  # no RL step yet: the policy is the warm start's
        settings = factory.PolicySpec(device="cpu", dtype=run_dtype(run))
        return ExportedPolicy(factory.load_policy(warm_start, settings), 0)
    if not saved:
        raise UsageError(
            f"{run}: no checkpoint in {checkpoint_dir(run)} (a run writes one every "
            "train.checkpoint_every steps and at its end)"
        )
    try:
        if step is None:
            payload = load_latest_checkpoint(run)
        elif step in saved:
            payload = load_checkpoint(saved[step])
        else:
            steps = ", ".join(str(s) for s in sorted(saved))
            raise UsageError(
                f"{run}: --step {step}: no checkpoint of that step in {checkpoint_dir(run)} "
                f"(saved steps: {steps})"
            )
    except ValueError as err:
        if isinstance(err, UsageError):
            raise
        raise UsageError(f"{run}: {' '.join(str(err).split())}") from None
    assert payload is not None  # checkpoint files exist: one was read or it raised
    settings = factory.PolicySpec(device="cpu", dtype=run_dtype(run))
    policy = factory.load_policy(warm_start, settings)
    policy.load_state_dict(payload["model"])
    return ExportedPolicy(policy, int(payload["step"]))


def _write_files(
    policy: Any, directory: Path, *, adapters: bool, final: Path, private: Path | None
) -> str:
    """Write ``policy`` into ``directory`` (merged, or its adapters with ``adapters``);
    ``final`` is where the directory will be once renamed (an adapter config naming a
    base inside the export names it there); a base inside ``private`` (the run
    directory) is copied into the export. Returns the format written."""
    from turnrl.policy import lora
    from turnrl.policy.hf import transformers_progress_off

    model = policy.model
    with transformers_progress_off():
        if adapters:
            if not lora.is_adapter_model(model):
                raise UsageError(
                    "--adapters: this policy has no LoRA adapters (policy.lora_rank = 0); "
                    "export it without --adapters"
                )
            lora.save_adapter_model(model, directory)
            _copy_private_base(directory, private)
            _point_base_at(directory, final)
        else:
            if lora.is_adapter_model(model):
                model = lora.merged_copy(model)
            model.save_pretrained(str(directory))
        policy.tokenizer.save_pretrained(str(directory))
    _embed_chat_template(directory, policy.tokenizer)
    return "adapters" if adapters else "merged"


def _embed_chat_template(directory: Path, tokenizer: Any) -> None:
    """Put the chat template into ``tokenizer_config.json`` too (transformers 5 writes
    it to ``chat_template.jinja`` only): loaders that read it from the config (older
    transformers, other serving stacks) get it as well; transformers 5 and vLLM read
    either, and both hold the same text."""
    template = getattr(tokenizer, "chat_template", None)
    config_file = directory / "tokenizer_config.json"
    if not isinstance(template, str) or not config_file.is_file():
        return
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config.setdefault("chat_template", template)
    atomic_write_json(config_file, config)


def _copy_private_base(directory: Path, private: Path | None) -> None:
    """Copy the adapters' base into the export (``base/``) when it lies inside
    ``private``: the tiny model's base is saved in the run's ``warm_start/base``, and an
    export must not depend on the run directory staying where it is."""
    from turnrl.policy.lora import ADAPTER_CONFIG, BASE_DIR

    if private is None or (directory / BASE_DIR).exists():
        return
    named = json.loads((directory / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    base = Path(named.get("base_model_name_or_path") or "").resolve()
    if base.is_dir() and base.is_relative_to(private.resolve()):
        shutil.copytree(base, directory / BASE_DIR)


def _point_base_at(directory: Path, final: Path) -> None:
    """An adapter config whose base was written inside the export (``base/``) names the
    base where the export will be after the rename, not in the temporary directory."""
    from turnrl.policy.lora import ADAPTER_CONFIG, BASE_DIR

    if not (directory / BASE_DIR).is_dir():
        return
    config_file = directory / ADAPTER_CONFIG
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = str((final / BASE_DIR).resolve())
    atomic_write_json(config_file, config)


def write_policy_directory(
    policy: Any,
    out: str | Path,
    *,
    adapters: bool = False,
    overwrite: bool = False,
    source: dict[str, Any] | None = None,
    keep: Callable[[Path], bool] | None = None,
    private: Path | None = None,
) -> Path:
    """Write ``policy`` (an ``HFPolicy``) to ``out`` as a Hugging Face model directory
    (see the module docstring), all or nothing; ``source`` goes into the manifest.

    An existing non-empty ``out`` is refused unless ``overwrite``; then it is replaced,
    keeping the entries ``keep`` accepts (moved into the new directory). An adapters
    export whose base lies inside ``private`` gets a copy of it. Returns ``out``.
    """
    target = Path(out)
    if target.exists() and not target.is_dir():
        raise UsageError(f"{target}: exists and is not a directory")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise UsageError(
            f"{target}: exists and is not empty; give --overwrite to replace it, or another -o"
        )
    with naming_write_failures(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(
            tempfile.mkdtemp(prefix=f".{target.name}.", suffix=TMP_SUFFIX, dir=target.parent)
        )
        try:
            kind = _write_files(policy, stage, adapters=adapters, final=target, private=private)
            atomic_write_json(stage / MANIFEST, {"format": kind, **(source or {})})
            _swap_in(stage, target, keep)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return target


def _swap_in(stage: Path, target: Path, keep: Callable[[Path], bool] | None) -> None:
    """Put the complete ``stage`` directory at ``target``: kept entries of an existing
    ``target`` move into it first, the old ``target`` is moved aside, ``stage`` renamed
    into place, the old one deleted."""
    if not target.exists():
        os.replace(stage, target)
        return
    if keep is not None:
        for entry in sorted(target.iterdir()):
            if keep(entry) and not (stage / entry.name).exists():
                os.replace(entry, stage / entry.name)
    aside = target.with_name(f".{target.name}.old{TMP_SUFFIX}")
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(target, aside)
    os.replace(stage, target)
    shutil.rmtree(aside, ignore_errors=True)


def is_step_export(entry: Path) -> bool:
    """Whether ``entry`` is a periodic export (``policy/step-N``), kept when the final
    policy replaces ``policy/``."""
    name = entry.name
    return entry.is_dir() and name.startswith(STEP_PREFIX) and name[len(STEP_PREFIX) :].isdigit()


def export_run(
    run_dir: str | Path,
    out: str | Path,
    *,
    warm_start: Path,
    step: int | None = None,
    adapters: bool = False,
    overwrite: bool = False,
    keep_step_exports: bool = False,
) -> tuple[Path, int]:
    """Export run ``run_dir``'s policy at checkpoint ``step`` (None: the last) to ``out``
    (see :func:`load_run_policy` and :func:`write_policy_directory`);
    ``keep_step_exports`` keeps the ``step-N`` directories of a replaced ``out`` (the
    run's own ``policy/``). Returns ``out`` and the step exported."""
    loaded = load_run_policy(run_dir, warm_start, step)
    source = {"run_dir": str(Path(run_dir).resolve()), "step": loaded.step}
    written = write_policy_directory(
        loaded.policy,
        out,
        adapters=adapters,
        overwrite=overwrite,
        source=source,
        keep=is_step_export if keep_step_exports else None,
        private=Path(run_dir),
    )
    return written, loaded.step
