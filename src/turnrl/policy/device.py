"""Where a policy runs and in which precision: ``policy.device`` and ``policy.dtype``.

``"auto"`` picks CUDA when torch sees a GPU, else the CPU. Precision names map to
torch dtypes; ``float32`` is the default everywhere (the tests' exactness checks
are in float32). ``bfloat16`` halves memory and is the usual choice on GPUs;
log-probs, the loss and its aggregation are computed in float32 whatever the
model's dtype. ``float16`` has no loss scaling here: use it to serve, not to train.
"""

from __future__ import annotations

import torch

DEVICES = ("auto", "cpu", "cuda")
"""Accepted ``policy.device`` values (``"cuda:N"`` selects one GPU)."""

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""Accepted ``policy.dtype`` values."""


def check_device_name(name: str) -> None:
    """Raise a clear error unless ``name`` is ``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""
    if name in DEVICES or (name.startswith("cuda:") and name[5:].isdigit()):
        return
    raise ValueError(f"device {name!r}: choose one of {', '.join(DEVICES)} (or cuda:N)")


def resolve_device(name: str) -> torch.device:
    """The torch device for ``name``; ``cuda`` without a visible GPU is a clear error."""
    check_device_name(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: torch sees no CUDA GPU (use 'auto' or 'cpu')")
    return torch.device(name)


def resolve_dtype(name: str) -> torch.dtype:
    """The torch dtype for a ``policy.dtype`` name."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype {name!r}: choose one of {', '.join(DTYPES)}") from None
