"""Structured uids: turn structure carried in verl's group index (no verl import).

A verl advantage estimator registered with ``register_adv_est`` receives only
the token rewards, the response mask, ``index`` (the batch's ``uid`` column) and
the algorithm config. A rollout that writes ``turnrl_uid(...)`` into ``uid``
therefore hands every turnrl estimator its task, trajectory, turn, role, state
and node, through verl's own dispatch, with no change to the trainer.

Trade-off: verl's own uses of ``uid`` (its built-in GRPO, DAPO's
``filter_groups``, prefix-sharing batch balancing) treat each distinct uid as a
group, and a structured uid is distinct per row. Use structured uids only with
``turnrl_*`` estimators and without uid-based filtering, or carry the fields in
the batch instead (``turnrl.integrations.verl.hook``), which leaves ``uid`` alone.

Format: ``"turnrl:" + JSON object`` with keys ``task`` (required), ``traj``,
``turn``, ``role``, ``state``, ``node``.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

UID_PREFIX = "turnrl:"
UID_KEYS: tuple[str, ...] = ("task", "traj", "turn", "role", "state", "node")


def turnrl_uid(
    task_id: str,
    *,
    traj_id: str | None = None,
    turn: int | None = None,
    role: str | None = None,
    state_key: str | None = None,
    node_id: str | None = None,
) -> str:
    """Encode one row's turn structure as a verl ``uid`` string."""
    fields: dict[str, Any] = {"task": task_id}
    for key, value in (
        ("traj", traj_id),
        ("turn", turn),
        ("role", role),
        ("state", state_key),
        ("node", node_id),
    ):
        if value is not None:
            fields[key] = value
    if "turn" in fields and (not isinstance(turn, int) or isinstance(turn, bool) or turn < 0):
        raise ValueError(f"turn must be an integer >= 0, got {turn!r}")
    return UID_PREFIX + json.dumps(fields, separators=(",", ":"), sort_keys=True)


def is_structured(index: Sequence[Hashable] | np.ndarray | None) -> bool:
    """True when the first uid is a structured one (all are then required to be)."""
    if index is None or len(index) == 0:
        return False
    first = index[0]
    return isinstance(first, str) and first.startswith(UID_PREFIX)


def parse_uids(index: Sequence[Hashable] | np.ndarray) -> dict[str, np.ndarray]:
    """Decode structured uids into per-row object columns (``None`` where absent).

    Raises ``ValueError`` naming the batch row of a uid that is not structured or
    not valid JSON, or that lacks ``task``. Columns absent from every row are left
    out of the result.
    """
    n = len(index)
    columns = {key: np.full(n, None, dtype=object) for key in UID_KEYS}
    seen: set[str] = set()
    for row, uid in enumerate(index):
        if not (isinstance(uid, str) and uid.startswith(UID_PREFIX)):
            raise ValueError(
                f"batch row {row}: uid {uid!r} is not a turnrl uid, but row 0's is; "
                "a batch uses structured uids on every row or on none"
            )
        try:
            fields = json.loads(uid[len(UID_PREFIX) :])
        except json.JSONDecodeError as exc:
            raise ValueError(f"batch row {row}: malformed turnrl uid ({exc.msg})") from exc
        if not isinstance(fields, dict) or "task" not in fields:
            raise ValueError(f"batch row {row}: turnrl uid has no 'task'")
        unknown = set(fields) - set(UID_KEYS)
        if unknown:
            raise ValueError(f"batch row {row}: turnrl uid has unknown key(s) {sorted(unknown)}")
        for key, value in fields.items():
            columns[key][row] = value
            seen.add(key)
    return {key: column for key, column in columns.items() if key in seen}
