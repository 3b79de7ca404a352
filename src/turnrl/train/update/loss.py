"""PPO-clip token loss for per-turn samples, and batch-level aggregation weights.

One row of a batch is one agent turn: its exact context, its response tokens, and one
advantage (credit is per turn, computed upstream by ``turnrl.credit``). The loss is the
clipped surrogate of PPO/GRPO applied to every response token, each token scaled by a
precomputed *aggregation weight*:

    loss = -sum_{b,t} w[b,t] * min(r[b,t] * A[b], clip(r[b,t], lo[b], hi[b]) * A[b])
           + kl_coef * sum_{b,t} w[b,t] * kl[b,t]

with ``r = exp(logp - old_logp)``, ``lo = 1 - clip_low * c[b]``, ``hi = 1 + clip_high * c[b]``.

Departures from / choices among the papers:

* **Aggregation is a weight tensor, computed once per batch** (``aggregation_weights``),
  not a ``mean`` inside the loss. The weights already contain every normaliser (total
  tokens, number of rows, number of rollouts), so the loss is a plain weighted *sum* and
  summing it over mini-batches gives exactly the full-batch loss: gradient accumulation
  is exact whatever the split. (A per-mini-batch ``mean`` silently re-weights tokens
  whenever mini-batches have different token counts.)
* ``rollout-mean`` is turnrl's own mode: every trajectory weighs the same however many
  turns it took, so multi-turn trajectories do not dominate the gradient (the
  length-weighting problem described in docs/architecture.md (Peers), at the loss level).
* Asymmetric clipping (``clip_high > clip_low``, "clip-higher" from DAPO) is allowed.
* ``clip_factor_B`` scales both clip widths per row: A2TGPO's adaptive per-turn clip
  range. How the factor is derived from information gain lives in ``turnrl.credit``;
  here it is just a positive number per row.
* The KL penalty to a reference policy uses the "k3" estimator by default
  (``exp(ref - logp) - (ref - logp) - 1``, Schulman's low-variance, always non-negative
  estimator, as in GRPO). ``k1`` (``logp - ref``) and ``k2`` (``(logp - ref)**2 / 2``)
  are available. Tokens were sampled from the behaviour policy, not the current one, so
  like every implementation we know of this is an approximation off-policy.
* Truncated importance sampling (TIS, off by default): when the sampler is another
  engine (vLLM), its log-probs differ from the learner's for the same weights. With
  ``is_weight_B_T`` every token's objective is multiplied by a fixed weight
  ``min(exp(logp_learner_old - logp_sampler), C)`` (:func:`truncated_is_weights`,
  token level, as verl's rollout correction ``token_is``), and the PPO ratio is then
  taken against the learner's own recomputation (the caller passes it as
  ``old_logp_B_T``). Tokens are only down- or up-weighted, never masked, so the loss
  denominator (the aggregation weights) is unchanged.
* No dual-clip and no entropy bonus.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Tensor = torch.Tensor

# --------------------------------------------------------------------------- weights


CountReducer = Callable[[Tensor], Tensor]
"""Maps a batch's own normaliser (a 0-d tensor: its tokens, rows or rollouts) to the one
its weights divide by. ``None`` keeps the batch's own; a learner split over processes
passes the sum over its ranks (:mod:`turnrl.train.distributed`), so every rank's
weights are its slice of the global batch's."""


def _reduced(count: Tensor, reduce: CountReducer | None) -> Tensor:
    return count if reduce is None else reduce(count)


def _token_mean(
    mask_B_T: Tensor, rollout_index_B: Tensor | None, reduce: CountReducer | None = None
) -> Tensor:
    """Every response token of the batch weighs ``1 / total_tokens``."""
    total = _reduced(mask_B_T.sum(), reduce)
    return mask_B_T / total.clamp(min=1.0)


def _seq_mean_token_mean(
    mask_B_T: Tensor, rollout_index_B: Tensor | None, reduce: CountReducer | None = None
) -> Tensor:
    """Every non-empty row weighs ``1 / n_rows``, split equally over its tokens."""
    len_B = mask_B_T.sum(dim=1)  # (B,)
    n_rows = _reduced((len_B > 0).sum(), reduce)
    row_weight_B = torch.where(len_B > 0, 1.0 / (len_B.clamp(min=1.0) * n_rows.clamp(min=1)), 0.0)
    return mask_B_T * row_weight_B[:, None]


def _rollout_mean(
    mask_B_T: Tensor, rollout_index_B: Tensor | None, reduce: CountReducer | None = None
) -> Tensor:
    """Every non-empty rollout weighs ``1 / n_rollouts``, split equally over all tokens
    of all its turns (rows)."""
    if rollout_index_B is None:
        raise ValueError("aggregation mode 'rollout-mean' needs rollout_index_B")
    rollout_index_B = torch.as_tensor(rollout_index_B, device=mask_B_T.device)
    if rollout_index_B.shape != mask_B_T.shape[:1]:
        raise ValueError(
            f"rollout_index_B has shape {tuple(rollout_index_B.shape)}, "
            f"expected ({mask_B_T.shape[0]},)"
        )
    _, group_B = torch.unique(rollout_index_B, return_inverse=True)
    n_groups = int(group_B.max().item()) + 1 if group_B.numel() else 0
    len_B = mask_B_T.sum(dim=1)
    rollout_tokens_G = torch.zeros(n_groups, dtype=mask_B_T.dtype, device=mask_B_T.device)
    rollout_tokens_G.index_add_(0, group_B, len_B)
    n_rollouts = _reduced((rollout_tokens_G > 0).sum(), reduce)
    tokens_B = rollout_tokens_G[group_B]
    row_weight_B = torch.where(
        tokens_B > 0, 1.0 / (tokens_B.clamp(min=1.0) * n_rollouts.clamp(min=1)), 0.0
    )
    return mask_B_T * row_weight_B[:, None]


AGGREGATIONS: dict[str, Callable[[Tensor, Tensor | None, CountReducer | None], Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "rollout-mean": _rollout_mean,
}
"""Aggregation modes by name: ``fn(mask_B_T as float64, rollout_index_B, reduce) -> weights``."""


def aggregation_weights(
    mask_B_T: Tensor,
    mode: str,
    rollout_index_B: Tensor | None = None,
    *,
    reduce_count: CountReducer | None = None,
) -> Tensor:
    """Per-token loss weights for the WHOLE batch (compute once, then slice per mini-batch).

    ``mask_B_T`` marks response tokens (bool or 0/1). Modes:

    * ``token-mean``: each token ``1 / total_tokens``.
    * ``seq-mean-token-mean``: each non-empty row ``1 / n_rows``, i.e. a token gets
      ``1 / (n_rows * len_row)``.
    * ``rollout-mean``: each non-empty rollout (rows sharing ``rollout_index_B``) gets
      ``1 / n_rollouts``; a token gets ``1 / (n_rollouts * tokens_in_rollout)``.

    Rows (and rollouts) with no tokens get weight 0 and are not counted, so the weights
    sum to 1 whenever the batch has at least one token (to 0 otherwise). Returned in
    float32 on the mask's device, shape ``(B, T)``. ``reduce_count`` replaces the
    normaliser (tokens, rows or rollouts) by the global batch's when this batch is one
    rank's share of it (see :data:`CountReducer`); the weights then sum to this share.
    """
    if mask_B_T.dim() != 2:
        raise ValueError(f"mask_B_T must be 2-D (B, T), got shape {tuple(mask_B_T.shape)}")
    try:
        fn = AGGREGATIONS[mode]
    except KeyError:
        raise ValueError(
            f"unknown aggregation mode {mode!r}; choose one of {sorted(AGGREGATIONS)}"
        ) from None
    # float64 so 1/total_tokens sums back to 1 tightly even for large batches.
    weights_B_T = fn(mask_B_T.to(torch.float64), rollout_index_B, reduce_count)
    return weights_B_T.to(torch.float32)


# --------------------------------------------------------------------------- KL


def _kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return logp - ref_logp


def _kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return 0.5 * (logp - ref_logp) ** 2


def _kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "k1": _kl_k1,
    "k2": _kl_k2,
    "k3": _kl_k3,
}
"""Per-token estimators of KL(current || reference) from log-probs of sampled tokens."""


def kl_penalty(logp_B_T: Tensor, ref_logp_B_T: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token KL estimate to the reference policy (``k1``, ``k2`` or ``k3``)."""
    try:
        fn = KL_ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(
            f"unknown KL estimator {estimator!r}; choose one of {sorted(KL_ESTIMATORS)}"
        ) from None
    return fn(logp_B_T, ref_logp_B_T)


# --------------------------------------------------------------------------- loss


def _check_shape(name: str, tensor: Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {shape}")


def ppo_clip_loss(
    logp_B_T: Tensor,
    old_logp_B_T: Tensor,
    adv_B: Tensor,
    mask_B_T: Tensor,
    token_weight_B_T: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_factor_B: Tensor | None = None,
    ref_logp_B_T: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    is_weight_B_T: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped-surrogate loss of a (mini-)batch of per-turn rows (see module docstring).

    Args:
        logp_B_T: log-probs of the response tokens under the current policy (with grad).
        old_logp_B_T: behaviour log-probs (from sampling); no grad needed.
        adv_B: one advantage per row (per turn).
        mask_B_T: 1/True on response tokens, 0/False on padding.
        token_weight_B_T: the rows' slice of ``aggregation_weights`` for the full batch.
        clip_low, clip_high: clip widths below/above 1 (may differ: "clip-higher").
        clip_factor_B: optional positive per-row factor scaling both widths (A2TGPO).
        ref_logp_B_T: optional reference-policy log-probs for the KL penalty.
        kl_coef: weight of the KL penalty (ignored when ``ref_logp_B_T`` is None).
        kl_estimator: ``"k3"`` (default), ``"k1"`` or ``"k2"``.
        is_weight_B_T: optional fixed per-token importance weights (truncated IS of the
            sampler's distribution to the learner's, :func:`truncated_is_weights`);
            they multiply each token's clipped objective.

    Returns:
        ``(loss, stats)``: ``loss`` is a scalar tensor (float32), a weighted *sum*, so
        mini-batch losses add up to the full-batch loss. ``stats`` holds floats, plain
        means over this mini-batch's response tokens: ``pg_loss`` and ``kl_loss`` (the
        two terms of ``loss``), ``clip_frac`` (share of tokens whose clipped term is
        active, i.e. that get no gradient), ``clip_frac_low``/``clip_frac_high``,
        ``ratio_mean``, ``approx_kl_old`` (k3 estimate of KL(behaviour || current)),
        ``kl_ref`` (when a reference is given), ``is_weight_mean`` (with
        ``is_weight_B_T``) and ``n_tokens``.
    """
    shape = tuple(logp_B_T.shape)
    if len(shape) != 2:
        raise ValueError(f"logp_B_T must be 2-D (B, T), got shape {shape}")
    _check_shape("old_logp_B_T", old_logp_B_T, shape)
    _check_shape("mask_B_T", mask_B_T, shape)
    _check_shape("token_weight_B_T", token_weight_B_T, shape)
    _check_shape("adv_B", adv_B, shape[:1])
    if clip_low < 0 or clip_high < 0:
        raise ValueError(
            f"clip widths must be >= 0, got clip_low={clip_low}, clip_high={clip_high}"
        )

    dtype = torch.float32
    mask = mask_B_T.to(torch.bool)
    weight = torch.where(mask, token_weight_B_T.to(dtype).detach(), 0.0)
    adv_B1 = adv_B.to(dtype)[:, None]

    # Padding positions may hold anything (even -inf): replace them by zeros BEFORE any
    # arithmetic, so neither the forward sum nor the backward pass can meet 0 * inf.
    logp = torch.where(mask, logp_B_T.to(dtype), 0.0)
    old_logp = torch.where(mask, old_logp_B_T.to(dtype).detach(), 0.0)
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)

    if clip_factor_B is None:
        factor_B1 = torch.ones_like(adv_B1)
    else:
        _check_shape("clip_factor_B", clip_factor_B, shape[:1])
        if bool((clip_factor_B < 0).any()):
            raise ValueError("clip_factor_B must be >= 0")
        factor_B1 = clip_factor_B.to(dtype)[:, None]
    lower_B1 = 1.0 - clip_low * factor_B1
    upper_B1 = 1.0 + clip_high * factor_B1

    clipped_ratio = torch.minimum(torch.maximum(ratio, lower_B1), upper_B1)
    unclipped_obj = ratio * adv_B1
    clipped_obj = clipped_ratio * adv_B1
    objective = torch.minimum(unclipped_obj, clipped_obj)
    if is_weight_B_T is not None:
        _check_shape("is_weight_B_T", is_weight_B_T, shape)
        objective = objective * torch.where(mask, is_weight_B_T.to(dtype).detach(), 0.0)
    pg_loss = -(weight * objective).sum()

    kl_loss = torch.zeros((), dtype=dtype, device=logp.device)
    kl_tok = None
    if ref_logp_B_T is not None:
        _check_shape("ref_logp_B_T", ref_logp_B_T, shape)
        ref = torch.where(mask, ref_logp_B_T.to(dtype).detach(), 0.0)
        kl_tok = torch.where(mask, kl_penalty(logp, ref, kl_estimator), 0.0)
        kl_loss = kl_coef * (weight * kl_tok).sum()
    loss = pg_loss + kl_loss

    with torch.no_grad():
        n_tokens = int(mask.sum().item())
        denom = max(n_tokens, 1)
        # The clipped term is active (zero gradient) when it is strictly smaller.
        active = mask & (clipped_obj < unclipped_obj)
        low = active & (ratio < lower_B1)
        high = active & (ratio > upper_B1)
        stats = {
            "pg_loss": float(pg_loss.item()),
            "kl_loss": float(kl_loss.item()),
            "clip_frac": float(active.sum().item()) / denom,
            "clip_frac_low": float(low.sum().item()) / denom,
            "clip_frac_high": float(high.sum().item()) / denom,
            "ratio_mean": float(ratio[mask].sum().item()) / denom,
            "approx_kl_old": float(torch.where(mask, ratio - 1.0 - log_ratio, 0.0).sum().item())
            / denom,
            "n_tokens": float(n_tokens),
        }
        if kl_tok is not None:
            stats["kl_ref"] = float(kl_tok.sum().item()) / denom
        if is_weight_B_T is not None:
            stats["is_weight_mean"] = float(is_weight_B_T.to(dtype)[mask].sum().item()) / denom
    return loss, stats


def truncated_is_weights(
    learner_logp_B_T: Tensor, sampler_logp_B_T: Tensor, mask_B_T: Tensor, cap: float
) -> Tensor:
    """Token-level truncated importance weights ``min(exp(learner - sampler), cap)``.

    ``learner_logp_B_T`` are the learner's log-probs of the sampled tokens before the
    update (its recomputation), ``sampler_logp_B_T`` the sampler's (the records'
    ``logprobs``). The weight corrects for sampling from the engine's distribution
    instead of the learner's; truncating at ``cap`` bounds its variance (TIS, as
    verl's rollout correction). 0 at padding; float32, no grad.
    """
    if not cap > 0:
        raise ValueError(f"the truncation cap must be > 0, got {cap!r}")
    shape = tuple(learner_logp_B_T.shape)
    _check_shape("sampler_logp_B_T", sampler_logp_B_T, shape)
    _check_shape("mask_B_T", mask_B_T, shape)
    mask = mask_B_T.to(torch.bool)
    with torch.no_grad():
        log_ratio = torch.where(mask, learner_logp_B_T.float() - sampler_logp_B_T.float(), 0.0)
        return torch.where(mask, torch.exp(log_ratio).clamp(max=cap), 0.0)
