"""The one place a policy is built: trainer, ``turnrl serve`` and Ray workers call it.

Three jobs, each one function:

* :func:`build_policy`: the learner a run starts from, named by ``policy.model``
  (``"tiny"``, a named pretrained model such as ``"smollm2"``, or a local model
  directory), on ``policy.device`` in ``policy.dtype``, with LoRA adapters when
  ``policy.lora_rank > 0``;
* :func:`load_policy`: a saved policy directory (a whole model or LoRA adapters), on
  the configured device and precision;
* :func:`build_sampler`: what rollouts sample with, by ``policy.backend``: the learner
  itself (``"hf"``, transformers' forward in this process) or a vLLM engine holding a
  copy of the learner's weights (``"vllm"``, :mod:`turnrl.policy.vllm`), which
  :func:`turnrl.policy.sync.push_weights` keeps current.

The settings are read from any object with the fields of ``turnrl.train.config.
PolicyConfig`` (:class:`PolicySettings`): the policy layer does not import the train
layer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from turnrl.policy.device import resolve_device, resolve_dtype
from turnrl.policy.hf import HFPolicy
from turnrl.policy.pretrained import MODEL_SOURCES, resolve_model_path
from turnrl.policy.tiny import MAX_POSITIONS, build_tiny_model, build_tiny_tokenizer

__all__ = [
    "BACKENDS",
    "PolicySettings",
    "PolicySpec",
    "build_policy",
    "build_sampler",
    "build_tiny_policy",
    "close_sampler",
    "load_policy",
    "with_lora",
]

BACKENDS = ("hf", "vllm", "vllm-server")
"""Accepted ``policy.backend`` values: what rollouts sample with."""


class PolicySettings(Protocol):
    """What the factory reads from a policy config (``PolicyConfig``'s fields)."""

    model: str
    hidden: int
    layers: int
    heads: int
    device: str
    dtype: str
    lora_rank: int
    lora_alpha: float
    lora_targets: list[str]
    backend: str
    server_url: str


@dataclass(frozen=True)
class PolicySpec:
    """:class:`PolicySettings` for callers without a run config (``turnrl serve
    --policy``): the built-in tiny model's shape, no LoRA, sampled in this process."""

    model: str = "tiny"
    device: str = "cpu"
    dtype: str = "float32"
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: list[str] = field(default_factory=list)
    backend: str = "hf"
    server_url: str = ""


def build_tiny_policy(seed: int = 0, **model_kwargs: int) -> HFPolicy:
    """An ``HFPolicy`` on a fresh tiny model (see :func:`build_tiny_model` for kwargs)."""
    tokenizer = build_tiny_tokenizer()
    return HFPolicy(build_tiny_model(tokenizer, seed=seed, **model_kwargs), tokenizer)


def tiny_heads(heads: int) -> dict[str, int]:
    """The tiny model's head keywords for ``heads`` attention heads: the default 4 keeps
    2 key/value heads (the built-in model); fewer heads get one key/value head each."""
    return {"heads": heads, "kv_heads": min(2, heads) if heads % 2 == 0 else 1}


def with_lora(policy: HFPolicy, settings: PolicySettings) -> HFPolicy:
    """``policy`` with fresh LoRA adapters if ``settings.lora_rank > 0`` and it has none
    yet (the model is wrapped in place)."""
    from turnrl.policy.lora import is_adapter_model, lora_policy

    if settings.lora_rank <= 0 or is_adapter_model(policy.model):
        return policy
    return lora_policy(
        policy, rank=settings.lora_rank, alpha=settings.lora_alpha, targets=settings.lora_targets
    )


def load_policy(path: str | Path, settings: PolicySettings | None = None) -> HFPolicy:
    """A saved policy directory, on ``settings.device`` in ``settings.dtype`` (CPU,
    float32 without settings). Adapters saved with it stay adapters."""
    if settings is None:
        return HFPolicy.from_pretrained(path)
    device, dtype = resolve_device(settings.device), resolve_dtype(settings.dtype)
    return HFPolicy.from_pretrained(path, device=device, dtype=dtype)


def model_source(model: str) -> Path | None:
    """The local directory ``policy.model`` names, or ``None`` for ``"tiny"``.

    Raises ``ValueError`` (naming ``policy.model``) for anything else."""
    return None if model == "tiny" else resolve_model_path(model)


def model_context(model: str) -> int | None:
    """Positions (prompt plus response) the model ``policy.model`` names accepts, when
    known without loading it: the tiny model's, or ``max_position_embeddings`` of a local
    directory's ``config.json``. ``None`` for a named pretrained model (not converted
    just to be checked) and a directory without a readable number there."""
    if model == "tiny":
        return MAX_POSITIONS
    if model in MODEL_SOURCES:
        return None
    try:
        config = json.loads((Path(model).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    context = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return context if isinstance(context, int) and not isinstance(context, bool) else None


def build_policy(settings: PolicySettings, seed: int) -> HFPolicy:
    """The learner named by ``settings.model``, on ``settings.device`` in
    ``settings.dtype``, with LoRA adapters when ``settings.lora_rank > 0``. ``seed`` fixes
    the tiny model's initial weights (and the LoRA adapters' draw follows the global RNG,
    as it always did)."""
    source = model_source(settings.model)
    if source is None:
        policy = build_tiny_policy(
            seed,
            hidden=settings.hidden,
            layers=settings.layers,
            **tiny_heads(getattr(settings, "heads", 4)),
        )
        device, dtype = resolve_device(settings.device), resolve_dtype(settings.dtype)
        policy.model.to(device=device, dtype=dtype)
    else:
        policy = load_policy(source, settings)
    return with_lora(policy, settings)


def initial_policy(
    policy: HFPolicy, init_from: str | Path | None, settings: PolicySettings
) -> HFPolicy:
    """The policy a fresh run starts from: the saved policy ``init_from`` (with LoRA as
    configured) when set, else ``policy``."""
    if init_from is None:
        return policy
    return with_lora(load_policy(init_from, settings), settings)


def build_sampler(
    settings: PolicySettings, learner: HFPolicy, *, rows: int | None = None, **engine_options: Any
) -> Any:
    """What rollouts sample with, by ``settings.backend``: ``learner`` itself for
    ``"hf"``; for ``"vllm"`` an in-process vLLM engine started from the learner's current
    weights (LoRA adapters merged), its token budget sized for ``rows`` rows per sampling
    call (the recipe's most); for ``"vllm-server"`` a client of the vLLM server at
    ``settings.server_url`` (the caller pushes the learner's weights to it next).
    ``engine_options`` go to :meth:`turnrl.policy.vllm.VLLMPolicy.from_policy` or
    :class:`turnrl.policy.vllm_server.VLLMServerPolicy`."""
    backend = getattr(settings, "backend", "hf")
    if backend == "hf":
        return learner
    if backend == "vllm":
        from turnrl.policy.vllm import VLLMPolicy

        engine_options.setdefault("enforce_eager", not getattr(settings, "vllm_compile", True))
        return VLLMPolicy.from_policy(learner, rows=rows, **engine_options)
    if backend == "vllm-server":
        from turnrl.policy.vllm_server import VLLMServerPolicy

        return VLLMServerPolicy.from_policy(learner, settings.server_url, **engine_options)
    raise ValueError(f"policy.backend = {backend!r}: choose one of {', '.join(BACKENDS)}")


def close_sampler(learner: Any, sampler: Any) -> None:
    """Release what :func:`build_sampler` started for ``learner``: a vLLM engine's core
    and its temporary weights (``sampler.close()``). Nothing for the learner itself
    (``"hf"``) or for no sampler (a run that stopped before building one). Trainers call
    it when a run ends, also when it ends with an error."""
    if sampler is None or sampler is learner:
        return
    close = getattr(sampler, "close", None)
    if close is not None:
        close()


def named_models() -> Sequence[str]:
    """Every name ``policy.model`` (and ``turnrl serve --policy``) accepts besides a
    directory."""
    return sorted(["tiny", *MODEL_SOURCES])
