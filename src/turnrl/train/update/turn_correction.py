"""Per-turn off-policy correction: every turn's tokens are weighted by the ratio of the
learner to the policy that sampled THAT turn.

A row of the update batch is one turn record, and its behaviour log-probs are the
record's ``logprobs``: what the sampler computed for that turn's tokens, at the sampling
temperature, with the weights of the record's ``policy_version``. A rollout whose turns
were sampled by two weight versions (an agent whose call came after a push, or a batch
sampled ``train.max_staleness`` versions ago) therefore gets each turn corrected by its
own behaviour policy, never by one sequence-level ratio over turns of different versions
(the per-sequence correction slime #1800 and ROLL #409 describe as wrong for multi-turn
rollouts).

The weight of a token is ``r = exp(learner - behaviour)``, the learner's log-prob
recomputed before the update at the sampling temperature:

* ``truncate`` (``train.tis_mode``, default): ``min(r, tis_cap)``, token-level truncated
  importance sampling (verl's rollout correction, AReaL's decoupled PPO weight);
* ``mask``: ``r`` where ``1 / tis_cap <= r <= tis_cap``, else 0: a token whose two
  policies disagree that much is dropped from the gradient (IcePop's masking, with the
  band symmetric in log space: the paper's two bounds are one cap here).

``tis_corrected_frac`` is the share of response tokens whose weight the rule changed
(capped, or masked).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor

from turnrl.train.update.loss import truncated_is_weights

__all__ = ["TIS_MODES", "TisMode", "global_fraction", "turn_is_weights"]

TisMode = Literal["truncate", "mask"]
TIS_MODES: tuple[TisMode, ...] = ("truncate", "mask")


def turn_is_weights(
    learner_logp_B_T: Tensor,
    behaviour_logp_B_T: Tensor,
    mask_B_T: Tensor,
    cap: float,
    mode: TisMode = "truncate",
) -> tuple[Tensor, dict[str, float]]:
    """Each turn's (row's) token weights against its own behaviour log-probs, and the
    ``tis_corrected_frac`` statistic (see the module docstring). 0 at padding; float32,
    no grad."""
    if mode not in TIS_MODES:
        raise ValueError(f"unknown tis_mode {mode!r}; known: {', '.join(TIS_MODES)}")
    tokens = mask_B_T.to(torch.bool)
    with torch.no_grad():
        log_ratio = torch.where(tokens, learner_logp_B_T.float() - behaviour_logp_B_T.float(), 0.0)
        ratio = torch.exp(log_ratio)
        if mode == "truncate":
            weights = truncated_is_weights(learner_logp_B_T, behaviour_logp_B_T, mask_B_T, cap)
            changed = tokens & (ratio > cap)
        else:
            if not cap > 0:
                raise ValueError(f"the truncation cap must be > 0, got {cap!r}")
            keep = tokens & (ratio >= 1.0 / cap) & (ratio <= cap)
            weights = torch.where(keep, ratio, 0.0)
            changed = tokens & ~keep
    count = int(tokens.sum())
    stats = {"tis_corrected_frac": float(changed.sum()) / count} if count else {}
    return weights, stats


def global_fraction(
    stats: dict[str, float], tokens: int, gather: Callable[[Any], list[Any]]
) -> dict[str, float]:
    """``tis_corrected_frac`` of the global batch under torchrun, from each rank's
    fraction of its own ``tokens`` response tokens (``gather``: every rank's value)."""
    ranks = gather((stats.get("tis_corrected_frac", 0.0), tokens))
    total = sum(count for _, count in ranks)
    changed = sum(round(frac * count) for frac, count in ranks)
    return {"tis_corrected_frac": changed / total} if total else {}
