"""The batch whose advantages verl is computing right now (set by the hook).

verl's registry hands an estimator only columns, not the batch. The hook
(``turnrl.integrations.verl.hook``) wraps the trainer's ``compute_advantage`` to
publish the ``DataProto`` here for the duration of the call; a ``turnrl_*``
estimator then reads the batch's other fields. The estimator accepts the batch
only if its ``uid`` column *is* the ``index`` array it was given (the same
object), so a stale or unrelated batch is never used.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_ACTIVE: ContextVar[Any] = ContextVar("turnrl_verl_batch", default=None)


@contextmanager
def active_batch(data: Any) -> Iterator[None]:
    """Publish ``data`` (a ``DataProto``) while the block runs."""
    token = _ACTIVE.set(data)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def batch_for(index: Any) -> Any:
    """The published batch if its ``uid`` column is ``index`` itself, else ``None``."""
    data = _ACTIVE.get()
    if data is None or index is None:
        return None
    uid = getattr(data, "non_tensor_batch", {}).get("uid")
    return data if uid is index else None
