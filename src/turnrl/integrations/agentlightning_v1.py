"""Agent Lightning 1.0 rollouts -> turn records (agentlightning 1.0.2, ``.venv-integrations``).

Agent Lightning 1.0 replaced 0.3's data model. Its gateway records every proxied
LLM call as a ``model_request`` event of the rollout in its store (and a
``reward`` event for the outcome); its verl trainer's rollout manager turns a
finished rollout's events into a ``CompletedRollout``
(``agentlightning.verl.agl_rollout_manager``): ``rollout_id``, ``data_id`` (one
id per dataset row, shared by that row's ``rollout.n`` rollouts), ``final_reward``
(the last reward event's value, None without one) and ``triplets``, one per
successful call with response tokens, in call order: ``prompt = {"token_ids"}``,
``response = {"token_ids", "log_probs", "routed_experts"}``, ``reward`` (the final
reward on the last triplet, None elsewhere), ``metadata = {"server": ...}``. That is
the object its ``RolloutAdapter`` turns into verl rows, and what this module reads
(the object, or its ``model_dump()``).

Mapping to turn records: as for 0.3 (:mod:`turnrl.integrations.agentlightning`,
whose conversion this module reuses), with ``task_id`` = ``data_id``, ``logprobs`` =
``response["log_probs"]`` and ``role`` = ``agent`` (1.0 records no agent name).
``rewards="final"`` (default) is what 1.0's trainer trains on: the final reward on
the last turn (1.0 writes it on every row of the rollout). A rollout without a
final reward is an error unless ``fillna=`` is given (1.0's trainer fills
``agentlightning.reward_fillna_value``, 0.0 by default).

A rollout's store events (``triplet_events_to_records``, the events in triplet
format, as the trainer fetches them) convert by the same rules as the trainer's
rollout manager builds its ``CompletedRollout``. Not converted: a 0.3
``RolloutLegacy`` (refused, with the function to use) and a 1.0 store ``Rollout``
(its calls are events in the store: pass them, or the ``CompletedRollout``).
``turnrl audit`` and every turnrl estimator then work on the records as for 0.3;
how 1.0's default rollout-level advantage compares with them is in
``docs/integrations-agentlightning.md``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from turnrl.errors import TurnRecordError
from turnrl.integrations.agentlightning import (
    RewardSource,
    _get,
    is_v1_rollout,
    rollout_to_records,
)
from turnrl.types import TurnRecord


def _as_v03_triplet(triplet: Any) -> dict[str, Any]:
    """A 1.0 triplet in 0.3's layout (``log_probs`` -> ``logprobs``)."""
    response = _get(triplet, "response") or {}
    return {
        "prompt": {"token_ids": _get(_get(triplet, "prompt"), "token_ids")},
        "response": {
            "token_ids": _get(response, "token_ids"),
            "logprobs": _get(response, "log_probs"),
        },
        "reward": _get(triplet, "reward"),
        "metadata": {},
    }


def completed_rollout_to_records(
    rollout: Any,
    *,
    task_id: str | None = None,
    rewards: RewardSource = "final",
    fillna: float | None = None,
) -> list[TurnRecord]:
    """One turn record per triplet of a 1.0 ``CompletedRollout`` (or its dump).

    ``task_id`` defaults to the rollout's ``data_id``; ``rewards`` and ``fillna``
    as in :func:`turnrl.integrations.agentlightning.rollout_to_records`.
    """
    rollout_id = _get(rollout, "rollout_id")
    where = f"rollout {rollout_id!r}"
    if not is_v1_rollout(rollout):
        raise TurnRecordError(
            where,
            None,
            None,
            f"is not an Agent Lightning 1.0 CompletedRollout ({type(rollout).__name__} "
            "without step/sample_idx_in_step): a 0.3 RolloutLegacy goes through "
            "turnrl.integrations.agentlightning.rollout_to_records",
        )
    if _get(rollout, "sample_idx_in_step") is None:
        raise TurnRecordError(
            where,
            None,
            "triplets",
            "is a 1.0 store Rollout: its LLM calls are events in the store; pass them "
            "to triplet_events_to_records, or pass the trainer's CompletedRollout",
        )
    metadata = _get(rollout, "metadata")
    shaped = {
        "rollout_id": rollout_id,
        "final_reward": _get(rollout, "final_reward"),
        "triplets": [_as_v03_triplet(t) for t in _get(rollout, "triplets") or []],
        "metadata": None if metadata is None else dict(metadata),
    }
    task = task_id if task_id is not None else _get(rollout, "data_id")
    return rollout_to_records(shaped, task_id=task, rewards=rewards, fillna=fillna)


def _reward_value(value: Any) -> float | None:
    """A reward event's value as 1.0's rollout manager reads it: numbers only, not bools."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def triplet_events_to_records(
    events: Iterable[Any],
    *,
    rollout_id: str,
    task_id: str,
    rewards: RewardSource = "final",
    fillna: float | None = None,
) -> list[TurnRecord]:
    """Turn records from one rollout's store events in triplet format.

    ``events`` are what ``GET /api/rollouts/{rollout_id}/events?format=triplet``
    returns (``Event`` objects or their JSON), the events 1.0's verl trainer reads.
    The rollout manager's rules are applied as it applies them: a ``model_request``
    that failed (``status`` "error" or ``http_status`` >= 400) or returned no
    response tokens is dropped; the final reward is the last ``reward`` event's
    value (None if that value is not a number). ``task_id``: the dataset row's id
    (1.0's trainer keeps it outside the store, as ``data_id``).
    """
    triplets: list[dict[str, Any]] = []
    reward_values: list[Any] = []
    for number, event in enumerate(events, start=1):
        kind, data = _get(event, "event_type"), _get(event, "data") or {}
        if kind == "reward":
            reward_values.append(data.get("value"))
        if kind != "model_request":
            continue
        if "response_token_ids" not in data:
            raise TurnRecordError(
                f"rollout {rollout_id!r}",
                number,
                "data.response_token_ids",
                "is missing: this is a raw model_request event; query the events "
                "with ?format=triplet (the store then extracts the token ids)",
            )
        status = data.get("http_status")
        failed = data.get("status") == "error" or (isinstance(status, int) and status >= 400)
        if failed or not data.get("response_token_ids"):
            continue
        triplets.append(
            {
                "prompt": {"token_ids": data.get("prompt_token_ids", [])},
                "response": {
                    "token_ids": data["response_token_ids"],
                    "logprobs": data.get("response_log_probs"),
                },
                "reward": None,
                "metadata": {},
            }
        )
    final = _reward_value(reward_values[-1]) if reward_values else None
    if triplets and final is not None:
        triplets[-1]["reward"] = final
    shaped = {"rollout_id": rollout_id, "final_reward": final, "triplets": triplets}
    return rollout_to_records(shaped, task_id=task_id, rewards=rewards, fillna=fillna)


def completed_rollouts_to_records(rollouts: Iterable[Any], **options: Any) -> list[TurnRecord]:
    """``completed_rollout_to_records`` over many rollouts, concatenated.

    Rollouts without triplets (failed, or no call returned tokens) are skipped,
    as 1.0's ``RolloutAdapter`` skips them: they give no training row.
    """
    return [
        record
        for rollout in rollouts
        if _get(rollout, "triplets")
        for record in completed_rollout_to_records(rollout, **options)
    ]
