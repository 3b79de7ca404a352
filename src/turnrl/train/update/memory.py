"""Peak memory of the update, measured the same way on any device.

``ActivationMeter`` counts what autograd keeps for the backward pass of each
forward it wraps (``torch.autograd.graph.saved_tensors_hooks``): the bytes of
the distinct storages of saved tensors, leaving out the model's parameters
(saved for the backward of every linear layer, but not extra memory). That is
the activation memory the update's layout decides (rows: every row's whole
context; tree: each distinct prefix once), and it is what grows with the batch;
the peak over forwards is reported. On CUDA, ``torch.cuda.max_memory_allocated``
during the update is reported as well (everything: weights, optimiser state,
activations, workspace).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

MIB = 2**20


class ActivationMeter:
    """Peak bytes saved for backward by one wrapped forward (see the module docstring)."""

    def __init__(self, model: Any) -> None:
        # an FSDP2-sharded parameter is a DTensor: its storage is this rank's shard; the
        # whole weights a forward gathers are new Parameters, left out in ``pack``
        self._parameters = {
            (p.to_local() if hasattr(p, "to_local") else p).untyped_storage().data_ptr()
            for p in model.parameters()
        }
        self.peak_bytes = 0

    @contextmanager
    def forward(self) -> Iterator[None]:
        """Count the tensors saved for backward inside this block (one forward)."""
        storages: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            pointer = storage.data_ptr()
            if pointer not in self._parameters and not _is_parameter(tensor):
                storages[pointer] = max(storages.get(pointer, 0), storage.nbytes())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield
        self.peak_bytes = max(self.peak_bytes, sum(storages.values()))

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / MIB


def _is_parameter(tensor: torch.Tensor) -> bool:
    """A parameter or a view of one (``weight.t()`` saved by a linear layer): under FSDP2
    the whole weights a forward gathers live in fresh storages, freed after the module
    runs, so only their type tells them from activations."""
    return isinstance(tensor, torch.nn.Parameter) or isinstance(tensor._base, torch.nn.Parameter)


@contextmanager
def cuda_peak(device: torch.device) -> Iterator[dict[str, float]]:
    """On a CUDA device, fill ``{"update_cuda_peak_mib": ...}`` with the peak memory
    allocated inside the block; elsewhere leave it empty."""
    out: dict[str, float] = {}
    if device.type != "cuda":
        yield out
        return
    torch.cuda.reset_peak_memory_stats(device)
    yield out
    out["update_cuda_peak_mib"] = torch.cuda.max_memory_allocated(device) / MIB
