"""LoRA adapters (peft) on an ``HFPolicy``: only the adapters train, the base stays frozen.

``lora_policy`` wraps a policy's model with ``peft.get_peft_model``; the wrapped
model is what ``HFPolicy`` keeps, so sampling, log-probs and the trainer work
unchanged. ``HFPolicy`` calls the other functions here for what differs with
adapters:

* ``parameters()`` yields trainable parameters only (the adapters);
* ``state_dict()`` holds the adapter weights only (a few MB instead of the whole
  model): checkpoints stay small, and the frozen base is re-loaded from its
  source directory;
* ``save(dir)`` writes the adapter (``adapter_config.json``,
  ``adapter_model.safetensors``) and the tokenizer; the adapter config names the
  base model's directory by absolute path. A base without a source directory
  (e.g. the in-memory tiny model) is saved to ``dir/base`` instead.
  ``HFPolicy.from_pretrained(dir)`` loads base + adapter, adapters trainable;
* ``clone_frozen()`` merges the adapters into a copy of the base (a plain model:
  faster forwards for the KL reference).

LoRA dropout is 0 on purpose: rollouts sample in eval mode and the update
recomputes log-probs in train mode, so any dropout would make the PPO ratio
differ from 1 on fresh samples.

peft is an optional dependency, imported only here and only when used.
"""

from __future__ import annotations

import contextlib
import copy
import json
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

PEFT_VERSION = "0.21.2"
"""The tested peft version."""
DEFAULT_TARGETS: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)
"""Every linear layer of a Llama/Qwen2-style block (attention and MLP)."""
ADAPTER_CONFIG = "adapter_config.json"
BASE_DIR = "base"


def _peft() -> Any:
    """The peft module, or a clear error saying how to install it."""
    try:
        import peft
    except ImportError as err:
        raise ImportError(
            f"LoRA needs peft; install it with `pip install peft=={PEFT_VERSION}`"
        ) from err
    return peft


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the deprecation warning peft triggers in transformers 5 (not ours to fix)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        yield


def is_adapter_model(model: Any) -> bool:
    """Whether ``model`` is a peft-wrapped model (checked without importing peft)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def is_adapter_dir(path: str | Path) -> bool:
    """Whether ``path`` holds a saved adapter (rather than a whole model)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def add_lora(
    model: Any, *, rank: int, alpha: float, targets: Sequence[str] = DEFAULT_TARGETS
) -> Any:
    """``model`` wrapped with fresh LoRA adapters (B = 0: outputs unchanged at first)."""
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    if not targets:
        raise ValueError("LoRA needs at least one target module name")
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(targets) - names)
    if missing:
        raise ValueError(f"LoRA targets {missing} are not modules of {type(model).__name__}")
    peft = _peft()
    config = peft.LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(targets),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with _quiet():
        return peft.get_peft_model(model, config)


class ModelPolicy(Protocol):
    """What ``lora_policy`` reads of a policy (``HFPolicy`` has it): its model,
    tokenizer and end-of-turn token, and a constructor taking them back."""

    model: Any
    tokenizer: Any
    end_of_turn: str

    def __init__(self, model: Any, tokenizer: Any, *, end_of_turn: str | None = None) -> None: ...


P = TypeVar("P", bound=ModelPolicy)


def lora_policy(
    policy: P, *, rank: int, alpha: float, targets: Sequence[str] = DEFAULT_TARGETS
) -> P:
    """A policy of ``policy``'s class on its model with LoRA adapters added (the model is
    wrapped in place: do not keep using ``policy`` for training). Built through
    ``type(policy)``, so this module never imports ``turnrl.policy.hf``, which imports it."""
    model = add_lora(policy.model, rank=rank, alpha=alpha, targets=targets)
    return type(policy)(model, policy.tokenizer, end_of_turn=policy.end_of_turn)


def adapter_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The adapter weights only (keys as peft saves them)."""
    return dict(_peft().get_peft_model_state_dict(model))


def load_adapter_state_dict(model: Any, state: Mapping[str, torch.Tensor]) -> None:
    """Load adapter weights saved by ``adapter_state_dict``; unknown keys are an error."""
    result = _peft().set_peft_model_state_dict(model, dict(state))
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise ValueError(f"adapter state has keys the model lacks: {unexpected[:5]}")


def _base_source(model: Any) -> Path | None:
    """The directory the base model was loaded from, if it still exists."""
    name = model.peft_config[model.active_adapter].base_model_name_or_path
    if name and Path(name).is_dir() and (Path(name) / "config.json").is_file():
        return Path(name).resolve()
    return None


def save_adapter_model(model: Any, directory: str | Path) -> None:
    """Save the adapter, naming the base directory by absolute path (or saving the base
    to ``directory/base`` when it was not loaded from a directory)."""
    directory = Path(directory)
    config = model.peft_config[model.active_adapter]
    source = _base_source(model)
    if source is None:
        with _quiet():
            base = copy.deepcopy(model).unload()
        base.save_pretrained(str(directory / BASE_DIR))
        source = directory / BASE_DIR
    config.base_model_name_or_path = str(source.resolve())
    model.save_pretrained(str(directory))


def load_adapter_model(
    directory: str | Path, *, dtype: torch.dtype = torch.float32, local_files_only: bool = True
) -> Any:
    """Base model + saved adapter from ``directory``, adapters trainable."""
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    config_file = directory / ADAPTER_CONFIG
    local_base = directory / BASE_DIR
    if local_base.is_dir():
        base_dir = local_base
    else:
        named = json.loads(config_file.read_text()).get("base_model_name_or_path")
        if not named or not Path(named).is_dir():
            raise FileNotFoundError(
                f"{config_file}: field 'base_model_name_or_path': base model directory "
                f"{named!r} not found (the adapter needs the model it was trained on)"
            )
        base_dir = Path(named)
    base = AutoModelForCausalLM.from_pretrained(
        str(base_dir), dtype=dtype, local_files_only=local_files_only
    )
    with _quiet():
        return _peft().PeftModel.from_pretrained(base, str(directory), is_trainable=True)


def merged_copy(model: Any) -> Any:
    """A plain model equal to base + adapters (``model`` itself is left unchanged)."""
    with _quiet():
        return copy.deepcopy(model).merge_and_unload()


def base_copy(model: Any) -> Any:
    """A plain model equal to the base, adapters dropped (``model`` is left unchanged)."""
    with _quiet():
        return copy.deepcopy(model).unload()
