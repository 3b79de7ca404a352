"""A verl batch (DataProto) -> TurnTable -> token-level advantages.

Where the turn structure of a batch row comes from, field by field (the first
source present wins):

================  ==========================  ==========================  ==============
table column      batch field (non-tensor)    Agent Lightning field       structured uid
================  ==========================  ==========================  ==============
task              ``uid``                     ``uid`` (= data id)         ``task``
trajectory        ``turnrl_traj_id``          ``rollout_id_list``         ``traj``
turn index        ``turnrl_turn``             ``turn_index_list``         ``turn``
role              ``turnrl_role``                                         ``role``
state key         ``turnrl_state_key``                                    ``state``
node id           ``turnrl_node_id``          (hashed from ``prompts``)   ``node``
info gain / q     ``turnrl_info_gain`` /
                  ``turnrl_q``
================  ==========================  ==========================  ==============

Layout: when a row has a turn index it is one turn (turn layout); otherwise its
response mask is split into assistant segments, one turn each (segment layout),
and a trajectory is a batch row unless ``turnrl_traj_id``/``rollout_id_list``
joins several rows. Per-row fields may hold one value per segment (a list).

Reward mode ``auto`` is ``broadcast`` when the trajectories come from Agent
Lightning's ``rollout_id_list`` (its daemon writes the rollout's final reward on
every row), else ``per_turn``; see ``turnrl.integrations.tokens``.

Only the ``uid``/mask/reward columns reach an estimator through verl's registry;
the other columns need ``turnrl.integrations.verl.hook`` (or ``compute_advantage``
below). Node ids need the prompt token ids, also only available with the batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from turnrl.integrations.tokens import (
    TokenTurns,
    build_table,
    context_node_ids,
    per_turn_values,
    scatter_to_tokens,
    split_turns,
)
from turnrl.integrations.verl.uid import is_structured, parse_uids
from turnrl.table import TurnTable

FIELD_PREFIX = "turnrl_"
BATCH_FIELDS: tuple[str, ...] = (
    "traj_id",
    "turn",
    "role",
    "state_key",
    "node_id",
    "info_gain",
    "q",
)
"""Per-row non-tensor fields read from ``turnrl_<name>``."""
AGL_TRAJ, AGL_TURN = "rollout_id_list", "turn_index_list"
"""Agent Lightning's daemon writes these non-tensor fields into its verl batches."""
UID_COLUMNS = {
    "traj": "traj_id",
    "turn": "turn",
    "role": "role",
    "state": "state_key",
    "node": "node_id",
}
READ_MODES: tuple[str, ...] = ("auto", "per_turn", "broadcast")
SOURCE = "<verl batch>"


@dataclass(frozen=True)
class BatchTurns:
    """A batch's turns: the table (row ``i`` = turn ``i``) and where each turn's tokens are."""

    table: TurnTable
    turns: TokenTurns
    has_nodes: bool
    """Whether node ids are real decision points (given or hashed), not one per turn."""


def _numpy(tensor: Any) -> np.ndarray:
    if isinstance(tensor, torch.Tensor):
        tensor = tensor.detach().to("cpu")
        if tensor.dtype in (torch.bfloat16, torch.float16):
            tensor = tensor.float()
        return tensor.numpy()
    return np.asarray(tensor)


def prompt_token_lists(prompts: Any, attention_mask: Any) -> list[list[int]]:
    """The unpadded prompt ids of each row (verl left-pads ``prompts``).

    ``attention_mask`` covers prompt and response (``(bs, P + L)``) or only the
    prompt; its first ``P`` columns mark the prompt's real tokens.
    """
    ids = _numpy(prompts)
    keep = _numpy(attention_mask)[:, : ids.shape[1]].astype(bool)
    return [row[k].tolist() for row, k in zip(ids, keep, strict=True)]


def _column(
    fields: Mapping[str, Any], uid_fields: Mapping[str, np.ndarray], name: str
) -> np.ndarray | None:
    value = fields.get(FIELD_PREFIX + name)
    if value is not None:
        return np.asarray(value) if not isinstance(value, np.ndarray) else value
    if name == "traj_id" and AGL_TRAJ in fields:
        return np.asarray(fields[AGL_TRAJ])
    if name == "turn" and AGL_TURN in fields:
        return np.asarray(fields[AGL_TURN])
    for uid_key, column in UID_COLUMNS.items():
        if column == name and uid_key in uid_fields:
            return uid_fields[uid_key]
    return None


def rows_to_turns(
    token_level_rewards: Any,
    response_mask: Any,
    index: Sequence[Any] | np.ndarray | None,
    *,
    fields: Mapping[str, Any] | None = None,
    prompt_ids: Sequence[Sequence[int]] | None = None,
    response_ids: Any = None,
    reward_mode: str = "auto",
    with_nodes: bool = False,
) -> BatchTurns:
    """Turns of a padded verl batch given its columns (tensors or arrays).

    ``index`` is the ``uid`` column (plain group ids or ``turnrl_uid`` strings);
    ``fields`` the non-tensor batch. ``with_nodes`` hashes exact contexts from
    ``prompt_ids`` (+ the response tokens before each segment) when no node ids
    are given. Raises ``ValueError`` on inconsistent input, naming the batch row.
    """
    if reward_mode not in READ_MODES:
        raise ValueError(f"unknown reward mode {reward_mode!r}; known: {', '.join(READ_MODES)}")
    if index is None:
        raise ValueError("the batch has no 'uid' column: turnrl needs it as the task (group) id")
    fields = fields or {}
    mask = _numpy(response_mask)
    rewards = _numpy(token_level_rewards)
    uid_fields = parse_uids(index) if is_structured(index) else {}
    task = uid_fields["task"] if uid_fields else (np.asarray(index, dtype=object))
    column = {name: _column(fields, uid_fields, name) for name in BATCH_FIELDS}
    turn = column["turn"]
    if turn is not None and any(t is None for t in turn):
        row = next(i for i, t in enumerate(turn) if t is None)
        raise ValueError(f"batch row {row}: turn index is missing (others have one)")
    turns = split_turns(mask, one_turn_per_row=turn is not None)
    if reward_mode == "auto":
        from_agl = FIELD_PREFIX + "traj_id" not in fields and AGL_TRAJ in fields
        reward_mode = "broadcast" if from_agl else "per_turn"
    node_id = column["node_id"]
    has_nodes = node_id is not None
    if node_id is None and with_nodes and prompt_ids is not None:
        task_per_turn = per_turn_values(task, turns, "uid")
        node_id = context_node_ids(task_per_turn, prompt_ids, _numpy(response_ids), turns)
        has_nodes = True
        table_nodes: Any = _one_per_row(node_id, turns)
    else:
        table_nodes = node_id
    table = build_table(
        turns,
        rewards,
        task_id=task,
        traj_id=column["traj_id"],
        turn=None if turn is None else turn.astype(np.int64),
        reward_mode=reward_mode,  # type: ignore[arg-type]
        role=column["role"],
        state_key=column["state_key"],
        node_id=table_nodes,
        info_gain=column["info_gain"],
        q=column["q"],
        source=SOURCE,
    )
    return BatchTurns(table, turns, has_nodes)


def _one_per_row(per_turn: np.ndarray, turns: TokenTurns) -> np.ndarray:
    """Regroup per-turn values into per-row lists (the input form of ``build_table``)."""
    out = np.empty(turns.first.shape[0], dtype=object)
    for r in range(out.shape[0]):
        lo = int(turns.first[r])
        out[r] = list(per_turn[lo : lo + int(turns.count[r])])
    return out


def batch_to_turns(data: Any, *, reward_mode: str = "auto", with_nodes: bool = False) -> BatchTurns:
    """Turns of a ``verl.DataProto``.

    Reads ``token_level_rewards`` (else ``token_level_scores``), ``response_mask``
    (else the response part of ``attention_mask``), the non-tensor batch, and for
    ``with_nodes`` ``prompts``/``responses``/``attention_mask``.
    """
    tensors = data.batch
    keys = set(tensors.keys())
    reward_key = "token_level_rewards" if "token_level_rewards" in keys else "token_level_scores"
    if reward_key not in keys:
        raise ValueError("the batch has neither 'token_level_rewards' nor 'token_level_scores'")
    rewards = tensors[reward_key]
    if "response_mask" in keys:
        mask = tensors["response_mask"]
    else:
        mask = tensors["attention_mask"][:, -rewards.shape[1] :]
    prompt_ids = None
    if with_nodes and {"prompts", "attention_mask"} <= keys:
        prompt_ids = prompt_token_lists(tensors["prompts"], tensors["attention_mask"])
    return rows_to_turns(
        rewards,
        mask,
        data.non_tensor_batch.get("uid"),
        fields=data.non_tensor_batch,
        prompt_ids=prompt_ids,
        response_ids=tensors["responses"] if "responses" in keys else None,
        reward_mode=reward_mode,
        with_nodes=with_nodes,
    )


def batch_to_table(data: Any, *, reward_mode: str = "auto", with_nodes: bool = False) -> TurnTable:
    """The ``TurnTable`` of a ``verl.DataProto`` (row ``i`` = turn ``i``).

    See ``batch_to_turns`` for what is read.
    """
    return batch_to_turns(data, reward_mode=reward_mode, with_nodes=with_nodes).table


def advantages_to_tokens(values: np.ndarray, turns: TokenTurns, like: Any = None) -> torch.Tensor:
    """Per-turn advantages -> ``(bs, L)`` float32 token advantages, 0 off the response mask.

    ``like`` (a tensor) gives the device; the dtype is always float32.
    """
    tokens = torch.from_numpy(scatter_to_tokens(values, turns))
    if isinstance(like, torch.Tensor):
        tokens = tokens.to(like.device)
    return tokens
