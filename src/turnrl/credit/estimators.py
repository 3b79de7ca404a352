"""The built-in advantage estimators. Importing this module registers all of them.

They live in three modules by the kind of score they normalise:

- ``estimators_outcome``: one outcome per trajectory (``grpo_mixed``, ``grpo``,
  ``dr_grpo``, ``rloo``);
- ``estimators_turn``: a score per turn grouped by decision point
  (``turn_group``, ``role_turn``, ``gigpo``, ``node``/``rtpo``, ``q``);
- ``estimators_ig``: information gain (``a2tgpo``, ``igpo``).

Each is a pure function ``(table, *, options) -> Credit`` registered by name, and
vectorised with ``np.bincount`` over the table's integer codes.
``turnrl.credit.reference`` holds a slow per-row implementation of each, used as
the oracle in tests and the baseline in ``benchmarks/credit.py``.
"""

from turnrl.credit.estimators_ig import a2tgpo, igpo
from turnrl.credit.estimators_outcome import dr_grpo, grpo, grpo_mixed, outcome_advantage, rloo
from turnrl.credit.estimators_turn import gigpo, node, normalised_return, q, role_turn, turn_group

__all__ = [
    "a2tgpo",
    "dr_grpo",
    "gigpo",
    "grpo",
    "grpo_mixed",
    "igpo",
    "node",
    "normalised_return",
    "outcome_advantage",
    "q",
    "rloo",
    "role_turn",
    "turn_group",
]
