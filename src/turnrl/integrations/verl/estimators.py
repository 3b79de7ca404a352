"""Every turnrl estimator as a verl advantage estimator ``turnrl_<name>``.

``register_all()`` puts one function per ``turnrl.credit.list_estimators()`` name
into verl's registry (``verl.trainer.ppo.core_algos.register_adv_est``), so
``algorithm.adv_estimator=turnrl_turn_group`` dispatches through verl's own
``get_adv_estimator_fn``. Each function has verl's estimator signature and
returns ``(advantages, returns)``, both the same ``(bs, L)`` float32 tensor (as
verl's GRPO does: there is no critic target for a group baseline).

Options come from the algorithm config, ``algorithm.turnrl`` (add it with
``+algorithm.turnrl.params.gamma=0.9`` on the Hydra command line), or, for
configs that reject unknown keys, the environment variable ``TURNRL_VERL`` (JSON,
same shape): ``{"reward_mode": "auto"|"per_turn"|"broadcast", "params": {...}}``.
``params`` are the estimator's own keyword options (``turnrl estimators`` lists
them).

verl's own settings that mean the same thing are honoured (``verl_options``):
``algorithm.norm_adv_by_std_in_grpo`` sets every std option of the estimator
(``use_std``, GiGPO's ``episode_use_std``/``step_use_std``), and
``algorithm.gamma`` sets its ``gamma`` (a discount per turn: verl's GAE
discounts per token, which for the turn-level estimators is the same only at
``gamma = 1``). Where an estimator cannot do what verl's value asks (A2TGPO
always divides its outcome advantage by the std, Dr. GRPO and RLOO never do;
outcome-only estimators do not discount) the value is refused with an error that
names the setting, as is a ``params`` entry that contradicts verl's value.

Departure: A2TGPO's per-turn clip factor (``Credit.clip_factor``) has no place in
verl's estimator return value; only its advantages are used.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from turnrl.credit import compute_credit, get_estimator, list_estimators
from turnrl.integrations.verl import context
from turnrl.integrations.verl.batch import (
    BatchTurns,
    advantages_to_tokens,
    batch_to_turns,
    rows_to_turns,
)

PREFIX = "turnrl_"
ENV_CONFIG = "TURNRL_VERL"
HOOK_MODULE = "turnrl.integrations.verl.hook"


def verl_name(estimator: str) -> str:
    """verl's name for a turnrl estimator: ``turnrl_<name>``."""
    return PREFIX + estimator


def _plain(value: Any) -> Any:
    """OmegaConf containers -> dicts (without importing omegaconf)."""
    if hasattr(value, "items") and not isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def turnrl_settings(config: Any) -> dict[str, Any]:
    """``{"reward_mode": str, "params": dict}`` from ``config.turnrl`` or ``$TURNRL_VERL``."""
    raw = None
    if config is not None:
        getter = getattr(config, "get", None)
        raw = getter("turnrl", None) if callable(getter) else getattr(config, "turnrl", None)
    if raw is None and os.environ.get(ENV_CONFIG):
        try:
            raw = json.loads(os.environ[ENV_CONFIG])
        except json.JSONDecodeError as exc:
            raise ValueError(f"${ENV_CONFIG} is not valid JSON: {exc.msg}") from exc
    settings = _plain(raw) or {}
    if not isinstance(settings, Mapping):
        raise ValueError(f"algorithm.turnrl must be a mapping, got {type(settings).__name__}")
    unknown = set(settings) - {"reward_mode", "params"}
    if unknown:
        raise ValueError(
            f"algorithm.turnrl has unknown key(s) {sorted(unknown)}; known: reward_mode, params"
        )
    params = _plain(settings.get("params")) or {}
    return {"reward_mode": settings.get("reward_mode", "auto"), "params": dict(params)}


STD_OPTIONS = ("use_std", "episode_use_std", "step_use_std")
"""Estimator options that mean verl's ``norm_adv_by_std_in_grpo``."""
FIXED_STD = {"a2tgpo": True, "dr_grpo": False, "rloo": False}
"""Whether estimators without a std option divide by the std (fixed by their method)."""


def _verl_setting(config: Any, key: str) -> Any:
    """``config.<key>`` of a verl algorithm config (DictConfig, AlgoConfig or dict)."""
    if config is None:
        return None
    if isinstance(config, Mapping):
        return config.get(key)
    getter = getattr(config, "get", None)
    return getter(key, None) if callable(getter) else getattr(config, key, None)


def _take(resolved: dict[str, Any], option: str, value: Any, setting: str, name: str) -> None:
    """Set ``option`` from verl's ``setting`` unless ``params`` contradicts it."""
    if option in resolved and resolved[option] != value:
        raise ValueError(
            f"algorithm.turnrl.params.{option}={resolved[option]!r} contradicts "
            f"{setting}={value!r}: {verl_name(name)} takes {option} from {setting}; "
            f"set {setting} (and drop the turnrl param)"
        )
    resolved[option] = value


def verl_options(name: str, config: Any, params: Mapping[str, Any]) -> dict[str, Any]:
    """The estimator's options: ``params`` plus verl's std and discount settings.

    See the module docstring for the mapping; raises ``ValueError`` naming the verl
    setting when the estimator cannot honour it or ``params`` contradicts it.
    """
    entry = get_estimator(name)
    defaults = entry.params()
    resolved = dict(params)
    norm = _verl_setting(config, "norm_adv_by_std_in_grpo")
    if norm is not None:
        setting, norm = "algorithm.norm_adv_by_std_in_grpo", bool(norm)
        std_options = [option for option in STD_OPTIONS if option in defaults]
        for option in std_options:
            _take(resolved, option, norm, setting, entry.name)
        if not std_options and norm != FIXED_STD[entry.name]:
            does = "always divides" if FIXED_STD[entry.name] else "never divides"
            raise ValueError(
                f"{verl_name(entry.name)} {does} its advantages by the group std, but "
                f"{setting}={norm}: set {setting}={str(not norm).lower()}"
            )
    gamma = _verl_setting(config, "gamma")
    if gamma is not None:
        setting, gamma = "algorithm.gamma", float(gamma)
        if "gamma" in defaults:
            _take(resolved, "gamma", gamma, setting, entry.name)
        elif gamma != 1.0:
            raise ValueError(
                f"{verl_name(entry.name)} scores a trajectory by its undiscounted outcome, "
                f"but {setting}={gamma}: set {setting}=1.0, or use an estimator that "
                "discounts per turn (turnrl_turn_group, turnrl_node, turnrl_gigpo, ...)"
            )
    return resolved


def _check_inputs(name: str, group_key: str, batch_turns: BatchTurns, hooked: bool) -> None:
    """Refuse to run a turn-aware estimator on data that lacks what it groups by."""
    table = batch_turns.table
    if group_key == "node" and not batch_turns.has_nodes:
        how = (
            "this batch has neither 'prompts' tensors nor turnrl_node_id"
            if hooked
            else f"load {HOOK_MODULE} (VERL_USE_EXTERNAL_MODULES) so node ids are hashed "
            "from the prompt tokens, or put 'node' in turnrl uids"
        )
        raise ValueError(
            f"estimator {verl_name(name)!r} groups turns by exact context (node id), "
            f"but none is known: {how}"
        )
    if group_key == "state" and not np.any(table.state_code >= 0):
        raise ValueError(
            f"estimator {verl_name(name)!r} groups turns by state key, but no row has one: "
            "set the non-tensor field turnrl_state_key (with the hook) or 'state' in turnrl uids"
        )


def make_estimator(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """verl-signature function running turnrl estimator ``name`` on a batch."""
    entry = get_estimator(name)
    with_nodes = entry.group_key == "node"

    def estimator(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: np.ndarray | None = None,
        config: Any = None,
        **_unused: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        settings = turnrl_settings(config)
        options = verl_options(entry.name, config, settings["params"])
        data = context.batch_for(index)
        if data is None and "agentlightning.verl.trainer" in sys.modules:
            raise RuntimeError(
                f"{verl_name(name)} under Agent Lightning needs the batch's rollout and turn ids: "
                f"set VERL_USE_EXTERNAL_MODULES={HOOK_MODULE} (not only "
                "turnrl.integrations.verl) so the trainer's advantage step passes them on"
            )
        if data is not None:
            batch_turns = batch_to_turns(
                data, reward_mode=settings["reward_mode"], with_nodes=with_nodes
            )
        else:
            batch_turns = rows_to_turns(
                token_level_rewards, response_mask, index, reward_mode=settings["reward_mode"]
            )
        _check_inputs(entry.name, entry.group_key, batch_turns, hooked=data is not None)
        credit = compute_credit(batch_turns.table, entry.name, **options)
        advantages = advantages_to_tokens(credit.advantages, batch_turns.turns, token_level_rewards)
        return advantages, advantages

    estimator.__name__ = f"compute_{verl_name(name)}_advantage"
    estimator.__doc__ = f"turnrl estimator {name!r} for verl: {entry.summary}"
    return estimator


def register_all() -> list[str]:
    """Register ``turnrl_<name>`` for every turnrl estimator in verl's registry; idempotent.

    Returns the verl names. An estimator already registered under that name by
    this function (e.g. on re-import) is left in place.
    """
    from verl.trainer.ppo import core_algos

    names = []
    for name in list_estimators():
        key = verl_name(name)
        existing = core_algos.ADV_ESTIMATOR_REGISTRY.get(key)
        if existing is None or not getattr(existing, "__turnrl__", False):
            fn = make_estimator(name)
            fn.__turnrl__ = True  # type: ignore[attr-defined]
            core_algos.ADV_ESTIMATOR_REGISTRY.pop(key, None)
            core_algos.register_adv_est(key)(fn)
        names.append(key)
    return names
