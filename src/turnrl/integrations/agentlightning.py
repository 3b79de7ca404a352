"""Agent Lightning rollouts -> turn records (extra ``agl``), and back.

Agent Lightning (0.3) records one ``Triplet`` per LLM call: ``prompt`` and
``response`` payloads (``{"token_ids": [...], "raw_content": ...}``), an optional
``reward`` and ``metadata`` (``agent_name``, ``response_id``, ...). A rollout
(``RolloutLegacy``, or its JSON dump) has a ``rollout_id``, its ``triplets``, a
``final_reward`` and the dataset row's ``data_id`` (in ``metadata``, or in
``task.metadata``). A store rollout (``Rollout``/``AttemptedRollout``, what
``LightningStore`` returns in 0.3) keeps spans instead: ``rollout_to_records``
refuses it with a message saying what to pass, and ``spans_to_records(spans,
rollout=...)`` converts it through Agent Lightning's own ``TracerTraceToTriplet``.

Mapping to turn records: ``task_id`` = data id (the question), ``traj_id`` =
rollout id, ``turn`` = position of the triplet, ``role`` = ``agent_name``,
``prompt_ids``/``response_ids`` = the exact token ids (so the default ``node_id``
is a hash of the exact context), ``logprobs`` when the response carries them.

Rewards (``rewards=``): ``"final"`` (default) is what Agent Lightning's verl
trainer trains on: the rollout's final reward (``final_reward``, else the last
triplet reward that is set) on the last turn, 0 elsewhere. ``"triplet"`` uses
each triplet's own reward (unset = 0). Either way the raw values are kept in the
pass-through fields ``agl_reward`` (per triplet) and ``agl_final_reward``, and the
rollout's ``task`` and ``metadata`` in ``agl_task``/``agl_metadata``, so
``records_to_rollout`` gives the rollout back unchanged (``trace`` and ``logs``
are not carried).

Token ids: a triplet without them (the LLM backend did not return token ids, as
OpenAI-compatible servers without vLLM's extension do) becomes a record without
``prompt_ids``/``response_ids``; its node id is then a hash of the prompt's chat
JSON, not of exact tokens, and it cannot be trained on token-exactly. This is
said once per process, as a warning on the ``turnrl.integrations.agentlightning``
logger (not ``warnings.warn``: importing Agent Lightning's store imports LiteLLM's
proxy, which replaces ``warnings.showwarning`` with one that prints nothing).

Agent Lightning's default grouping (its verl trainer sets ``uid`` = data id, one
row per triplet, the final reward on every row) is turnrl's ``grpo_mixed``:
``turnrl audit`` on these records shows how it mixes turns; any other turnrl
estimator can replace it (see ``docs/integrations-agentlightning.md``).

Agent Lightning 1.0 changed the data model (no ``RolloutLegacy``, no spans: the
store keeps events, and its verl trainer builds ``CompletedRollout`` objects):
:mod:`turnrl.integrations.agentlightning_v1` converts those. The installed
version is read at import (``AGENTLIGHTNING_VERSION``, from the package metadata,
without importing it); a 1.0 object given to a function here, or a function here
that imports 0.3's classes while 1.0 is installed, is refused with what to use.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from turnrl.errors import CapabilityError, TurnRecordError
from turnrl.io import iter_jsonl
from turnrl.records import check_record
from turnrl.types import AglData, TurnRecord

RewardSource = Literal["final", "triplet"]


logger = logging.getLogger(__name__)
_warned_missing_ids = False


def installed_agentlightning() -> str | None:
    """The installed agentlightning version (from its metadata, not imported), or None."""
    try:
        return metadata.version("agentlightning")
    except metadata.PackageNotFoundError:
        return None


AGENTLIGHTNING_VERSION = installed_agentlightning()
"""The agentlightning version found at import (None: not installed)."""

_MODULE_FOR = {
    "0": "turnrl.integrations.agentlightning",
    "1": "turnrl.integrations.agentlightning_v1",
}


def require_agentlightning(major: str, what: str) -> None:
    """Refuse ``what`` unless the installed agentlightning has major version ``major``.

    Its 0.3 and 1.0 releases share the package name but not the classes, so a
    mismatch would otherwise surface as an ImportError deep inside a conversion.
    """
    found = AGENTLIGHTNING_VERSION
    if found is None:
        raise CapabilityError(f"{what} needs agentlightning {major}.x installed; it is not")
    if found.split(".")[0] != major:
        raise CapabilityError(
            f"{what} needs agentlightning {major}.x, but {found} is installed: "
            f"use {_MODULE_FOR.get(found.split('.')[0], 'the adapter for that version')}"
        )


def is_v1_rollout(rollout: Any) -> bool:
    """Whether ``rollout`` (object or JSON dump) is of Agent Lightning 1.0's data model.

    1.0's ``CompletedRollout`` (its verl trainer's) has ``sample_idx_in_step``;
    1.0's store ``Rollout`` has a ``status`` object with a ``state``. 0.3's
    ``RolloutLegacy`` has neither, and 0.3's store ``Rollout`` has a string status.
    """
    return _get(rollout, "sample_idx_in_step") is not None or (
        _get(_get(rollout, "status"), "state") is not None
    )


def _warn_missing_token_ids(where: str, missing: int, total: int) -> None:
    """Say once per process that records came out without exact token ids."""
    global _warned_missing_ids
    if _warned_missing_ids:
        return
    _warned_missing_ids = True
    logger.warning(
        f"{where}: {missing} of {total} triplets carry no prompt/response token ids, so "
        "their turn records have no prompt_ids/response_ids: node ids fall back to a hash "
        "of the prompt's chat JSON (not exact tokens) and the records cannot be trained on "
        "token-exactly. The LLM backend did not return token ids (serve the model with vLLM "
        "through Agent Lightning's LLMProxy, which records them). Warned once per process; "
        "later rollouts may lack them too."
    )


def _get(obj: Any, name: str, default: Any = None) -> Any:
    """Field of a pydantic model or a plain mapping (a JSON dump of one)."""
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def rollout_data_id(rollout: Any) -> str | None:
    """The dataset row id Agent Lightning stores with a rollout, if any."""
    for holder in (_get(rollout, "metadata"), _get(_get(rollout, "task"), "metadata")):
        if isinstance(holder, Mapping) and holder.get("data_id") is not None:
            return str(holder["data_id"])
    return None


def _final_reward(rollout: Any, triplets: Sequence[Any], fillna: float | None) -> float:
    """Agent Lightning's rule: ``final_reward``, else the last triplet reward that is set."""
    final = _get(rollout, "final_reward")
    if final is None:
        final = next(
            (_get(t, "reward") for t in reversed(triplets) if _get(t, "reward") is not None), None
        )
    if final is None:
        if fillna is None:
            raise TurnRecordError(
                f"rollout {_get(rollout, 'rollout_id')!r}",
                None,
                "final_reward",
                "is missing and no triplet has a reward (pass fillna= to default it)",
            )
        final = fillna
    return float(final)


def _token_ids(payload: Any, where: str) -> list[int] | None:
    ids = _get(payload, "token_ids") if payload is not None else None
    if ids is None or (isinstance(ids, list) and not ids):
        return None
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise TurnRecordError(where, None, "token_ids", "must be a list of integers")
    return list(ids)


def _logprobs(response: Any, n_tokens: int | None) -> list[float] | None:
    """OpenAI-style ``[{"logprob": x, ...}, ...]`` (or plain floats) aligned with the ids."""
    content = _get(response, "logprobs") if response is not None else None
    if not isinstance(content, list) or n_tokens is None or len(content) != n_tokens:
        return None
    values = [_get(c, "logprob") if not isinstance(c, int | float) else c for c in content]
    if all(isinstance(v, int | float) and math.isfinite(v) for v in values):
        return [float(v) for v in values]
    return None


def _chat_prompt(prompt: Any) -> list[dict[str, Any]] | None:
    """The raw chat messages, if they are a valid turn-record ``prompt``."""
    raw = _get(prompt, "raw_content") if prompt is not None else None
    if isinstance(raw, list) and all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in raw
    ):
        return [dict(m) for m in raw]
    return None


def _is_store_rollout(rollout: Any) -> bool:
    """A ``LightningStore`` rollout (``Rollout``/``AttemptedRollout``): spans, no triplets."""
    return _get(rollout, "triplets") is None and (
        _get(rollout, "attempt") is not None or _get(rollout, "input") is not None
    )


def _plain(value: Any) -> Any:
    """A pydantic model as JSON-ready data; anything else unchanged."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value


def rollout_to_records(
    rollout: Any,
    *,
    task_id: str | None = None,
    rewards: RewardSource = "final",
    fillna: float | None = None,
) -> list[dict[str, Any]]:
    """One turn record per triplet of an Agent Lightning rollout.

    ``rollout`` is a ``RolloutLegacy`` or a mapping with the same fields; a store
    rollout (``AttemptedRollout``) is refused with a message saying to pass its
    spans to ``spans_to_records``. ``task_id`` defaults to the rollout's data id
    (an error if it has none). ``fillna`` replaces a missing final reward (as
    Agent Lightning's ``reward_fillna_value``); without it a missing reward is an
    error.
    """
    if rewards not in ("final", "triplet"):
        raise ValueError(f"rewards must be 'final' or 'triplet', got {rewards!r}")
    rollout_id = _get(rollout, "rollout_id")
    if not rollout_id:
        raise TurnRecordError("<rollout>", None, "rollout_id", "is required")
    where = f"rollout {rollout_id!r}"
    if is_v1_rollout(rollout):
        raise TurnRecordError(
            where,
            None,
            "triplets",
            f"is an Agent Lightning 1.0 rollout ({type(rollout).__name__}); this function "
            "reads 0.3's RolloutLegacy: use turnrl.integrations.agentlightning_v1."
            "completed_rollout_to_records",
        )
    if _is_store_rollout(rollout):
        raise TurnRecordError(
            where,
            None,
            "triplets",
            f"is a store rollout ({type(rollout).__name__}): it keeps spans, not triplets; "
            "pass its spans instead: spans_to_records(await store.query_spans("
            "rollout.rollout_id, rollout.attempt.attempt_id), rollout=rollout)",
        )
    task = task_id if task_id is not None else rollout_data_id(rollout)
    if task is None:
        raise TurnRecordError(where, None, "data_id", "is missing: pass task_id=")
    triplets = list(_get(rollout, "triplets") or [])
    if not triplets:
        raise TurnRecordError(where, None, "triplets", "no triplets (nothing to train on)")
    final = _final_reward(rollout, triplets, fillna)
    raw_final = _get(rollout, "final_reward")
    agl_task = None if _get(rollout, "task") is None else _plain(_get(rollout, "task"))
    agl_metadata = _get(rollout, "metadata")
    out = []
    missing_ids = 0
    for k, triplet in enumerate(triplets):
        prompt, response = _get(triplet, "prompt"), _get(triplet, "response")
        metadata = _get(triplet, "metadata") or {}
        raw_reward = _get(triplet, "reward")
        if rewards == "final":
            reward = final if k == len(triplets) - 1 else 0.0
        else:
            reward = 0.0 if raw_reward is None else float(raw_reward)
        response_ids = _token_ids(response, f"{where}, triplet {k} response")
        prompt_ids = _token_ids(prompt, f"{where}, triplet {k} prompt")
        missing_ids += prompt_ids is None or response_ids is None
        chat = _chat_prompt(prompt)
        response_id = metadata.get("response_id")
        record = TurnRecord(
            task_id=str(task),
            traj_id=str(rollout_id),
            turn=k,
            role=str(metadata.get("agent_name") or "agent"),
            prompt=None if chat is None else tuple(chat),
            prompt_ids=None if prompt_ids is None else tuple(prompt_ids),
            response_ids=None if response_ids is None else tuple(response_ids),
            logprobs=_logprobs(response, None if response_ids is None else len(response_ids)),
            reward=reward,
            done=k == len(triplets) - 1,
            agl=AglData(
                reward=raw_reward,
                final_reward=raw_final,
                response_id=None if response_id is None else str(response_id),
                task=agl_task,
                metadata=None if agl_metadata is None else dict(agl_metadata),
            ),
        )
        out.append(check_record(record, source=where, line=k + 1))
    if missing_ids:
        _warn_missing_token_ids(where, missing_ids, len(triplets))
    return out


def rollouts_to_records(rollouts: Iterable[Any], **options: Any) -> list[TurnRecord]:
    """``rollout_to_records`` over many rollouts, concatenated."""
    return [record for rollout in rollouts for record in rollout_to_records(rollout, **options)]


def read_rollouts_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Rollout dumps, one JSON object per line (``RolloutLegacy.model_dump()``), read by
    the strict reader of :mod:`turnrl.io`."""
    out = []
    for number, obj in iter_jsonl(path, error=TurnRecordError):
        if not isinstance(obj, dict):
            raise TurnRecordError(str(path), number, None, "a rollout must be a JSON object")
        out.append(obj)
    return out


def spans_to_records(
    spans: Sequence[Any],
    *,
    rollout: Any = None,
    task_id: str | None = None,
    rollout_id: str | None = None,
    final_reward: float | None = None,
    adapter: Any = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Turn records from a rollout's spans, via Agent Lightning's trace-to-triplet adapter.

    ``rollout`` is the store's ``Rollout``/``AttemptedRollout`` the spans belong to
    (``store.query_spans(rollout.rollout_id, rollout.attempt.attempt_id)``): it gives
    the rollout id, the task id (its ``metadata["data_id"]``, as Agent Lightning's
    verl daemon sets it) and the attempt the spans must come from. Without it pass
    ``task_id`` and ``rollout_id``. ``adapter`` defaults to
    ``agentlightning.TracerTraceToTriplet()`` (the one its verl trainer uses).
    Needs ``agentlightning`` installed.
    """
    if rollout is not None:
        rollout_id = rollout_id or _get(rollout, "rollout_id")
        task_id = task_id if task_id is not None else rollout_data_id(rollout)
        attempt = _get(_get(rollout, "attempt"), "attempt_id")
        other = {_get(span, "attempt_id") for span in spans} - {attempt, None}
        if attempt is not None and other:
            raise ValueError(
                f"rollout {rollout_id!r}: spans of attempt(s) {sorted(other)} given with "
                f"attempt {attempt!r}; query the spans of that attempt only"
            )
    if not rollout_id:
        raise ValueError("spans_to_records needs rollout= (the store's rollout) or rollout_id=")
    if task_id is None:
        raise TurnRecordError(
            f"rollout {rollout_id!r}", None, "data_id", "is missing: pass task_id="
        )
    if adapter is None:
        require_agentlightning("0", "spans_to_records (TracerTraceToTriplet)")
        from agentlightning.adapter import TracerTraceToTriplet

        adapter = TracerTraceToTriplet()
    triplets = adapter.adapt(spans)
    converted = {"rollout_id": rollout_id, "final_reward": final_reward, "triplets": triplets}
    return rollout_to_records(converted, task_id=task_id, **options)


def records_to_rollout(records: Sequence[TurnRecord]) -> Any:
    """Rebuild the ``agentlightning.RolloutLegacy`` of one trajectory's records.

    Uses the pass-through fields ``agl_reward``/``agl_final_reward``, ``agl_task``
    and ``agl_metadata`` when present (records made by ``rollout_to_records``), else
    ``reward`` and ``metadata = {"data_id": task_id}``. Needs ``agentlightning``.
    """
    require_agentlightning("0", "records_to_rollout (RolloutLegacy)")
    from agentlightning.types import RolloutLegacy, Task, Triplet

    if not records:
        raise ValueError("no records")
    ordered = sorted(records, key=lambda r: r.turn)
    traj_ids = {r.traj_id for r in ordered}
    if len(traj_ids) != 1:
        raise ValueError(f"records of one rollout expected, got trajectories {sorted(traj_ids)}")
    triplets = []
    for record in ordered:
        prompt: dict[str, Any] = {"token_ids": list(record.prompt_ids or [])}
        if record.prompt is not None:
            chat = record.prompt
            prompt["raw_content"] = chat if isinstance(chat, str) else [dict(m) for m in chat]
        response: dict[str, Any] = {"token_ids": list(record.response_ids or [])}
        if record.logprobs is not None:
            response["logprobs"] = [{"logprob": v} for v in record.logprobs]
        metadata: dict[str, Any] = {"agent_name": record.role}
        if record.agl is not None and record.agl.response_id is not None:
            metadata["response_id"] = record.agl.response_id
        reward = record.agl.reward if record.agl is not None else record.reward
        triplets.append(Triplet(prompt=prompt, response=response, reward=reward, metadata=metadata))
    last = ordered[-1]
    agl = last.agl
    final = agl.final_reward if agl is not None else sum(r.reward for r in ordered)
    task = None if agl is None else agl.task
    metadata = None if agl is None else agl.metadata
    return RolloutLegacy(
        rollout_id=last.traj_id,
        task=None if task is None else Task.model_validate(task),
        final_reward=final,
        triplets=triplets,
        metadata=dict(metadata) if metadata is not None else {"data_id": last.task_id},
    )
