"""Policies: the ``Policy`` protocol on transformers models, and a tiny offline model.

``HFPolicy`` wraps any causal LM with a chat template; ``build_tiny_policy`` gives
a randomly initialised character-level Qwen2 model for tests and smoke runs.

The names below load on first use (PEP 562), so that a submodule that needs neither
torch nor transformers (``turnrl.policy.pretrained``, which finds the SmolLM2
directory) imports in a fraction of a second instead of the ~5-10 s those two take:
``make test-vllm`` and the benchmarks look the directory up that way.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # explicit re-exports for type checkers (``X as X``)
    from turnrl.policy.factory import build_tiny_policy as build_tiny_policy
    from turnrl.policy.hf import HFPolicy as HFPolicy
    from turnrl.policy.hf import load_tokenizer as load_tokenizer
    from turnrl.policy.tiny import build_tiny_model as build_tiny_model
    from turnrl.policy.tiny import build_tiny_tokenizer as build_tiny_tokenizer

_HOMES = {
    "HFPolicy": "turnrl.policy.hf",
    "build_tiny_model": "turnrl.policy.tiny",
    "build_tiny_policy": "turnrl.policy.factory",
    "build_tiny_tokenizer": "turnrl.policy.tiny",
    "load_tokenizer": "turnrl.policy.hf",
}
"""Each public name and the submodule that defines it."""

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    """Import the submodule defining ``name`` on first access (then it is cached here)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
