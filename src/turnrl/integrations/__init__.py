"""Adapters to other training frameworks (optional extras).

* ``turnrl.integrations.verl`` (extra ``verl``): every estimator in verl's
  advantage-estimator registry as ``turnrl_<name>``; DataProto <-> TurnTable.
* ``turnrl.integrations.agentlightning`` (extra ``agl``): Agent Lightning 0.3 rollouts
  (triplets) -> turn records; ``agentlightning_v1``: Agent Lightning 1.0's
  ``CompletedRollout`` and store events -> turn records.
* ``turnrl.integrations.trl`` (extra ``trl``): turnrl environments as a TRL
  ``rollout_func`` and per-token turnrl advantages in a ``GRPOTrainer`` subclass.
* ``turnrl.integrations.tokens``: the numpy core they share (padded token rows
  <-> turns).

Nothing here is imported by the rest of turnrl; each adapter imports its
framework only when the adapter itself is imported.
"""
