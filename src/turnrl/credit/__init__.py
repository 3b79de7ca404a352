"""Credit assignment: group keys, estimators and the audit. numpy only, no torch.

Public API::

    from turnrl.credit import compute_advantages, compute_credit, list_estimators
    adv = compute_advantages(table, "turn_group", gamma=1.0)
"""

from turnrl.credit import estimators as _estimators  # noqa: F401  (registers estimators)
from turnrl.credit.registry import (
    Credit,
    compute_advantages,
    compute_credit,
    get_estimator,
    list_estimators,
    register_estimator,
)

__all__ = [
    "Credit",
    "compute_advantages",
    "compute_credit",
    "get_estimator",
    "list_estimators",
    "register_estimator",
]
