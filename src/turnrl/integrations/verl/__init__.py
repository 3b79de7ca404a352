"""turnrl credit inside verl (extra ``verl``): every estimator as ``turnrl_<name>``.

Importing this package registers ``turnrl_grpo``, ``turnrl_turn_group``, ... in
verl's advantage-estimator registry. verl imports it in the driver when told::

    VERL_USE_EXTERNAL_MODULES=turnrl.integrations.verl   # registry only
    VERL_USE_EXTERNAL_MODULES=turnrl.integrations.verl.hook  # + batch fields

and ``algorithm.adv_estimator=turnrl_turn_group`` selects one. How turn structure
reaches an estimator (response-mask segments, structured uids, or batch fields
via the hook) and the trade-offs are in ``docs/integrations-verl.md``.

Public API: ``register_all``, ``verl_name``, ``turnrl_uid``, ``batch_to_table``,
``batch_to_turns``, ``rows_to_turns``, ``advantages_to_tokens``,
``compute_advantage`` (write turnrl advantages into a ``DataProto`` directly),
``verl_options`` (how verl's gamma and std settings become estimator options).
"""

from __future__ import annotations

from typing import Any

from turnrl.credit import compute_credit
from turnrl.integrations.verl.batch import (
    BatchTurns,
    advantages_to_tokens,
    batch_to_table,
    batch_to_turns,
    rows_to_turns,
)
from turnrl.integrations.verl.estimators import (
    register_all,
    turnrl_settings,
    verl_name,
    verl_options,
)
from turnrl.integrations.verl.uid import parse_uids, turnrl_uid


def compute_advantage(
    data: Any, estimator: str, *, reward_mode: str = "auto", **params: Any
) -> Any:
    """Write turnrl advantages (and returns, the same tensor) into a ``DataProto``.

    For trainers that call their own advantage step: no registry, no hook. Node
    ids are hashed from the prompt tokens when the estimator groups by node.
    Returns ``data``.
    """
    from turnrl.credit import get_estimator

    entry = get_estimator(estimator)
    batch_turns = batch_to_turns(
        data, reward_mode=reward_mode, with_nodes=entry.group_key == "node"
    )
    credit = compute_credit(batch_turns.table, entry.name, **params)
    mask = data.batch["response_mask"] if "response_mask" in set(data.batch.keys()) else None
    advantages = advantages_to_tokens(credit.advantages, batch_turns.turns, mask)
    data.batch["advantages"] = advantages
    data.batch["returns"] = advantages
    return data


REGISTERED: list[str] = register_all()
"""The verl names registered on import."""

__all__ = [
    "REGISTERED",
    "BatchTurns",
    "advantages_to_tokens",
    "batch_to_table",
    "batch_to_turns",
    "compute_advantage",
    "parse_uids",
    "register_all",
    "rows_to_turns",
    "turnrl_settings",
    "turnrl_uid",
    "verl_name",
    "verl_options",
]
