"""Token-id rows as batch tensors: length checks and padding."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_ids(
    rows: Sequence[Sequence[int]], pad_id: int, *, left: bool, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad rows to one length (on the left for generation, the right for scoring);
    return ids ``[B, L]`` and attention mask ``[B, L]`` (1 on real tokens) on ``device``."""
    length = max(len(r) for r in rows)
    ids_B_L = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask_B_L = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(length - len(row), length) if left else slice(0, len(row))
        ids_B_L[i, span] = torch.tensor(list(row), dtype=torch.long)
        mask_B_L[i, span] = 1
    return ids_B_L.to(device), mask_B_L.to(device)


def check_lengths(
    contexts: Sequence[Sequence[int]], extra: Sequence[int], max_context: int | None
) -> None:
    """Clear errors for empty contexts and for ones too long for the model (``extra``:
    the positions each context still needs after itself)."""
    for i, (context, more) in enumerate(zip(contexts, extra, strict=True)):
        if len(context) == 0:
            raise ValueError(f"contexts[{i}] is empty")
        if max_context is not None and len(context) + more > max_context:
            raise ValueError(
                f"contexts[{i}]: {len(context)} context tokens + {more} more exceed the "
                f"model's max positions ({max_context})"
            )
