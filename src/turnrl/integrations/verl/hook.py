"""Opt-in wrapper of verl's advantage step, so ``turnrl_*`` estimators see the whole batch.

Import this module (``VERL_USE_EXTERNAL_MODULES=turnrl.integrations.verl.hook``)
instead of ``turnrl.integrations.verl`` to get everything the plain module gives
(the ``turnrl_*`` estimators in verl's registry) plus: ``compute_advantage`` in
``verl.trainer.ppo.ray_trainer`` (used by ``RayPPOTrainer`` and by Agent
Lightning's trainer) is wrapped so that, while it runs, the estimators can read
the batch's non-tensor fields (``turnrl_*``, Agent Lightning's
``rollout_id_list``/``turn_index_list``) and prompt tokens (for exact node ids).
Dispatch still goes through verl's registry; the wrapper only publishes the
batch (``turnrl.integrations.verl.context``) and then calls verl's function.

Trade-off against structured uids: ``uid`` keeps its meaning for the rest of verl,
and per-segment fields and node ids work; but it replaces a module attribute of
verl, so it works only where the trainer calls ``compute_advantage`` through that
module (the legacy ``RayPPOTrainer`` and trainers that import it from there, like
Agent Lightning's). verl's new ``trainer.use_v1`` trainer fetches only fixed
columns for its advantage step; there use segments or structured uids.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from turnrl.integrations.verl.context import active_batch
from turnrl.integrations.verl.estimators import register_all


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compute_advantage(data: Any, *args: Any, **kwargs: Any) -> Any:
        with active_batch(data):
            return original(data, *args, **kwargs)

    compute_advantage.__turnrl_original__ = original  # type: ignore[attr-defined]
    return compute_advantage


def _rebind(old: Callable[..., Any], new: Callable[..., Any]) -> None:
    """Point every imported module's ``compute_advantage`` that is ``old`` at ``new``.

    Reads module ``__dict__``s directly: ``getattr`` on lazy modules (transformers)
    would trigger their imports.
    """
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and namespace.get("compute_advantage") is old:
            module.compute_advantage = new


def install() -> Callable[..., Any]:
    """Wrap verl's ``compute_advantage`` (idempotent); returns the wrapper.

    Also rebinds the name in modules already imported that took it with
    ``from verl.trainer.ppo.ray_trainer import compute_advantage``; modules
    imported later pick the wrapper up from ``ray_trainer`` itself.
    """
    from verl.trainer.ppo import ray_trainer

    current = ray_trainer.compute_advantage
    if hasattr(current, "__turnrl_original__"):
        return current
    wrapped = _wrap(current)
    _rebind(current, wrapped)
    return wrapped


def uninstall() -> None:
    """Restore verl's own ``compute_advantage`` everywhere the wrapper was bound."""
    from verl.trainer.ppo import ray_trainer

    wrapped = ray_trainer.compute_advantage
    original = getattr(wrapped, "__turnrl_original__", None)
    if original is None:
        return
    _rebind(wrapped, original)


register_all()
install()
