"""Policies: the ``Policy`` protocol on transformers models, and a tiny offline model.

``HFPolicy`` wraps any causal LM with a chat template; ``build_tiny_policy`` gives
a randomly initialised character-level Qwen2 model for tests and smoke runs.
"""

from __future__ import annotations

from turnrl.policy.factory import build_tiny_policy
from turnrl.policy.hf import HFPolicy, load_tokenizer
from turnrl.policy.tiny import build_tiny_model, build_tiny_tokenizer

__all__ = [
    "HFPolicy",
    "build_tiny_model",
    "build_tiny_policy",
    "build_tiny_tokenizer",
    "load_tokenizer",
]
