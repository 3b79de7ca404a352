"""The PPO update every trainer shares: its config, the update batch, ``ppo_update``.

``turnrl train`` (environment rollouts), the agent loop (records from the gateway)
and Iterative GRPO's improvement step (candidates scored by Q) all end in the same
update: turn records with one advantage each -> :func:`build_update_batch` ->
:func:`ppo_update`, configured by one :class:`PPOConfig` section (``[train]`` and
``[improve]`` are PPO sections with their trainer's own fields added).

What the update gets right, and tests pin (tests/test_ppo.py):

* training log-probs are recomputed at the **sampling temperature**, so the first
  mini-batch's ratio to the behaviour log-probs is exactly 1;
* aggregation weights are computed once for the whole batch and each mini-batch's
  are scaled by the number of mini-batches, so the mean of the mini-batch gradients
  is the full-batch gradient, whatever the split;
* the A2TGPO clip factor (per row) scales both clip widths;
* with ``kl_coef > 0`` the frozen reference policy's log-probs (same temperature)
  enter the loss.

Two layouts compute the same log-probs (``PPOConfig.update``): ``rows`` runs every
row's whole context through the model, rows packed without padding
(:mod:`turnrl.policy.packing`); ``tree`` (the default) runs each mini-batch's
distinct token prefixes once (:mod:`turnrl.policy.tree_layout`), with mini-batches
of whole task trees (:mod:`turnrl.train.update.minibatches`). Both cut a
mini-batch into forwards of at most ``max_tokens_per_batch`` positions (gradients
accumulate within the step; the loss weights are the whole batch's, so the split
changes no number beyond float rounding). The loss, its aggregation, clip factors
and KL are the same code on the same numbers; tests/test_tree_update.py checks
gradients against ``rows``, tests/test_packing.py packed rows against padded ones.

Besides the loss statistics, ``ppo_update`` reports ``entropy``: the mean over the
trained tokens of the entropy (nats) of the learner's tempered distribution at each,
from the forwards the loss uses (no extra forward; a metric only, there is no entropy
bonus), averaged over the optimiser steps like the loss statistics, so with one epoch
and one mini-batch it is the entropy of the policy the batch was trained from. It
then reports what the update computed:
``update_tokens_rows`` (positions a per-row update runs: every row's context +
response), ``update_tokens_computed`` (positions this update ran),
``update_tokens_unique`` (distinct token prefixes per task, summed over tasks,
as the rollouts' ``tokens_unique``; the tree layout can go below it, because
rows of different tasks in one forward share their common prefix, e.g. the
system prompt), all summed over epochs, and peak memory
(:mod:`turnrl.train.update.memory`).

Train/inference mismatch (``log_mismatch``, ``tis_cap``; :mod:`turnrl.train.update.mismatch`):
before the first step the learner recomputes every row's log-probs, the ``mismatch_*``
metrics compare them with the sampler's, and with ``tis_cap > 0`` they become the PPO
ratio's denominator while importance weights correct each turn for the policy that
sampled it (``tis_mode``: truncated or masked;
:func:`turnrl.train.update.turn_correction.turn_is_weights`).

A diverged update is refused (:mod:`turnrl.train.update.divergence`): each optimiser
step whose loss or gradient norm is not finite raises before ``optimizer.step()``, and
weights left non-finite by the update, or so large that a forward of the batch's
shortest row overflows, raise after it; either way no checkpoint of it is saved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from turnrl.policy.logprobs import LayoutLogprobs
from turnrl.policy.memory_savers import configured_memory_savers
from turnrl.policy.packing import token_budget_groups
from turnrl.policy.trainable import TrainablePolicy
from turnrl.policy.tree_layout import split_rows
from turnrl.rollout.tokens import trie_size
from turnrl.table import TurnTable
from turnrl.train.config import PPOConfig
from turnrl.train.update.credit_check import check_finite_credit
from turnrl.train.update.divergence import (
    DivergedUpdateError,
    check_finite_parameters,
    check_finite_step,
    non_finite_parameters,
)
from turnrl.train.update.legacy_pipeline import AGGREGATION as LEGACY_AGGREGATION
from turnrl.train.update.legacy_pipeline import LegacyPipeline, legacy_aggregation_weights
from turnrl.train.update.loss import (
    CountReducer,
    aggregation_weights,
    ppo_clip_loss,
)
from turnrl.train.update.memory import ActivationMeter, cuda_peak
from turnrl.train.update.minibatches import row_minibatches, tree_minibatches
from turnrl.train.update.mismatch import learner_logprobs, mismatch_stats
from turnrl.train.update.turn_correction import global_fraction, turn_is_weights
from turnrl.types import TurnRecord

__all__ = [
    "PPOConfig",
    "UpdateBatch",
    "UpdateShard",
    "build_update_batch",
    "merge_loss_stats",
    "pad_rows",
    "ppo_update",
    "trainable_rows",
]


def pad_rows(rows: list[list[float]], width: int, value: float = 0.0) -> torch.Tensor:
    """Right-pad float rows into a ``(len(rows), width)`` tensor."""
    out = torch.full((len(rows), width), value, dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


@dataclass
class UpdateBatch:
    """The trainable rows of one step (turns with at least one response token)."""

    contexts: list[list[int]]
    responses: list[list[int]]
    old_logp_B_T: torch.Tensor
    """Behaviour log-probs (at the sampling temperature), 0 at padding."""
    mask_B_T: torch.Tensor
    adv_B: torch.Tensor
    clip_factor_B: torch.Tensor | None
    """Per-row multiplier of both clip widths (A2TGPO), or None."""
    weight_B_T: torch.Tensor
    """Aggregation weights of the whole batch (they sum to 1)."""
    tree_B: torch.Tensor
    """The tree (task) of each row: ``update = "tree"`` keeps a tree in one mini-batch."""


@dataclass(frozen=True)
class UpdateShard:
    """This process's share of an update whose batch is split over ranks by task
    (:mod:`turnrl.train.distributed`); ``None`` in one process.

    The global batch is the one a single process would build from all ranks' records,
    in that process's row order; mini-batches are drawn over it (same generator, same
    plan on every rank) and each rank runs the rows it holds.
    """

    positions: list[int]
    """Global position of each of this rank's rows (one per row of its ``UpdateBatch``)."""
    tree_B: list[int]
    """Tree (task) of every global row, by position; distinct trees, distinct ids."""
    reduce_gradients: Callable[[list[torch.nn.Parameter]], None]
    """Sums the gradients of a mini-batch over ranks (every rank calls it each step)."""
    gather: Callable[[Any], list[Any]]
    """Every rank's value of a picklable object, in rank order (every rank calls it)."""
    lockstep: bool = False
    """Every rank runs the same number of forwards and backwards per optimiser step (an
    FSDP2-sharded learner, whose forwards are collectives): a rank with fewer pads with
    zero-weight forwards (:func:`padding_forward`), which add nothing to any gradient.
    The learner's pass before the update (``train.log_mismatch``, ``train.tis_cap``)
    runs as many forwards on every rank too (:meth:`busiest`)."""

    def busiest(self, count: int) -> int:
        """The largest of every rank's ``count`` (every rank calls it)."""
        return max(self.gather(count))


def trainable_rows(records: list[TurnRecord]) -> list[int]:
    """Indices of the records an update trains on (see :func:`build_update_batch`)."""
    return [i for i, r in enumerate(records) if r.response_ids and r.train]


def build_update_batch(
    records: list[TurnRecord],
    table: TurnTable,
    advantages: np.ndarray,
    clip_factor: np.ndarray | None,
    aggregation: str,
    *,
    reduce_count: CountReducer | None = None,
    legacy: LegacyPipeline | None = None,
    legacy_seed: int = 0,
) -> UpdateBatch:
    """The padded update batch of the rows that are trained on.

    Rows without response tokens, and rows marked ``train = false`` (tree
    rollouts' copies of shared turns: they count in the credit table, for returns
    and trajectory structure, but are updated on once, through the original), are
    left out; ``advantages`` and ``clip_factor`` are per record, as ``table``. A
    non-finite return or advantage is refused here, before any update
    (:func:`~turnrl.train.update.credit_check.check_finite_credit`). ``reduce_count`` makes
    the aggregation weights those of a global batch this one is a share of (see
    :func:`turnrl.train.update.loss.aggregation_weights`). ``aggregation = "legacy-verl"`` takes
    the pipeline's knobs (``legacy``) and the seed of its shuffle (``legacy_seed``); see
    :mod:`turnrl.train.update.legacy_pipeline`.
    """
    check_finite_credit(table, advantages)
    keep = trainable_rows(records)
    if not keep:
        raise ValueError("no record to update on (every row is train=false or has no response)")
    responses = [list(records[i].response_ids or ()) for i in keep]
    width = max(len(r) for r in responses)
    mask = pad_rows([[1.0] * len(r) for r in responses], width)
    rollout = torch.as_tensor(table.traj_code[keep])
    contexts = [list(records[i].prompt_ids or ()) for i in keep]
    if aggregation == LEGACY_AGGREGATION:
        if legacy is None or reduce_count is not None:
            raise ValueError(
                f"aggregation {LEGACY_AGGREGATION!r} needs the pipeline's knobs (legacy=...) "
                "and one process (no reduce_count)"
            )
        weight_B_T = legacy_aggregation_weights(
            mask, [len(c) for c in contexts], legacy, legacy_seed
        )
    else:
        weight_B_T = aggregation_weights(mask, aggregation, rollout, reduce_count=reduce_count)
    return UpdateBatch(
        contexts=contexts,
        responses=responses,
        old_logp_B_T=pad_rows([list(records[i].logprobs or ()) for i in keep], width),
        mask_B_T=mask,
        adv_B=torch.as_tensor(advantages[keep], dtype=torch.float32),
        clip_factor_B=None
        if clip_factor is None
        else torch.as_tensor(clip_factor[keep], dtype=torch.float32),
        weight_B_T=weight_B_T,
        tree_B=torch.as_tensor(table.task_code[keep]),
    )


def ppo_update(
    policy: TrainablePolicy,
    optimizer: torch.optim.Optimizer,
    batch: UpdateBatch,
    config: PPOConfig,
    *,
    temperature: float,
    reference: TrainablePolicy | None,
    seed: int,
    shard: UpdateShard | None = None,
) -> dict[str, float]:
    """``config.epochs`` passes of mini-batch PPO-clip steps over one batch of turns.

    ``temperature`` is the one the batch was sampled at (log-probs are recomputed at
    it); ``seed`` fixes the mini-batch order; ``reference`` (frozen) enables the KL
    penalty when ``config.kl_coef > 0``. ``config.max_grad_norm`` clips the gradient
    norm (0: no clipping; the norm is still reported). ``config.update`` picks the
    layout (see the module docstring). Returns the mean of each loss statistic over
    the optimiser steps, the token counts and peak memory.

    With ``shard`` (several ranks), the mini-batches are drawn over the global batch,
    each rank runs its rows of each, and the gradients are summed over ranks before
    the clip and the step; the statistics are the global batch's on every rank
    (``cuda_*`` peaks stay this rank's).
    """
    tree_B = batch.tree_B.tolist() if shard is None else shard.tree_B
    local = None if shard is None else {p: b for b, p in enumerate(shard.positions)}
    tree = config.update == "tree"
    generator = torch.Generator().manual_seed(seed)
    steps: list[tuple[list[dict[str, float]], float]] = []
    parameters = [p for p in policy.parameters() if p.requires_grad]
    mismatch: dict[str, float] = {}
    is_weight_B_T = None
    if config.log_mismatch or config.tis_cap > 0:
        learner_B_T = learner_logprobs(
            policy,
            batch,
            temperature=temperature,
            max_tokens=config.max_tokens_per_batch,
            forwards_of_busiest=None if shard is None or not shard.lockstep else shard.busiest,
        )
        gather = None if shard is None else shard.gather
        mismatch = mismatch_stats(learner_B_T, batch.old_logp_B_T, batch.mask_B_T, gather)
        if config.tis_cap > 0:  # per turn: each row against its own behaviour log-probs
            is_weight_B_T, corrected = turn_is_weights(
                learner_B_T, batch.old_logp_B_T, batch.mask_B_T, config.tis_cap, config.tis_mode
            )
            if gather is not None:  # the global batch's share of corrected tokens
                corrected = global_fraction(corrected, int(batch.mask_B_T.sum()), gather)
            mismatch.update(corrected)
            batch = replace(batch, old_logp_B_T=learner_B_T)
    meter = ActivationMeter(policy.model)
    computed = 0
    plan = []  # per epoch: its mini-batches, each the rows of each of its forwards here
    for _ in range(config.epochs):
        if tree:
            minibatches = tree_minibatches(tree_B, config.minibatch_size, generator)
        else:
            minibatches = row_minibatches(len(tree_B), config.minibatch_size, generator)
        if local is not None:
            minibatches = [[local[p] for p in rows if p in local] for rows in minibatches]
        plan.append([_forwards(batch, rows, config) if rows else [] for rows in minibatches])
    padding = [[0] * len(epoch) for epoch in plan]
    if shard is not None and shard.lockstep:
        padding = _lockstep_padding(plan, shard)
    policy.model.train()
    with cuda_peak(policy.device) as cuda, configured_memory_savers(policy, config):
        for epoch, pads in zip(plan, padding, strict=True):
            for forwards, pad in zip(epoch, pads, strict=True):
                optimizer.zero_grad(set_to_none=True)
                parts = []
                for _ in range(pad):
                    computed += padding_forward(policy, batch, config, temperature)
                for forward_rows in forwards:
                    with meter.forward():
                        loss, info, tokens = _minibatch_loss(
                            policy,
                            reference,
                            batch,
                            forward_rows,
                            config,
                            scale=len(epoch),
                            temperature=temperature,
                            is_weight_B_T=is_weight_B_T,
                        )
                    loss.backward()
                    computed += tokens
                    parts.append({**info, "loss": float(loss.item())})
                if shard is not None:
                    shard.reduce_gradients(parameters)
                norm = _clip_grad_norm(parameters, config.max_grad_norm)
                where = f"optimiser step {len(steps) + 1} of the update"
                # the norm is the global one on every rank; a loss is this rank's share
                loss_here = sum(p["loss"] for p in parts) if shard is None else 0.0
                check_finite_step(loss_here, norm, where)
                optimizer.step()
                steps.append((parts, norm))
    policy.model.eval()
    bad = non_finite_parameters(parameters)
    if shard is not None:  # every rank decides alike (FSDP2 ranks hold different shards)
        bad = sum(shard.gather(bad))
    check_finite_parameters(parameters, f"the update's {len(steps)} optimiser steps", bad)
    if shard is None or not shard.lockstep:  # a sharded forward is a collective: skipped
        _check_finite_forward(policy, batch, config, temperature, shard, len(steps))
    counts = {
        **update_token_counts(batch, config.epochs),
        "update_tokens_computed": float(computed),
    }
    activation_mib = meter.peak_mib
    if shard is not None:  # every rank's forwards of each step, and its counts
        ranks = shard.gather(([parts for parts, _ in steps], counts, activation_mib))
        for i, (_, norm) in enumerate(steps):
            steps[i] = ([p for rank_parts, _, _ in ranks for p in rank_parts[i]], norm)
        counts = {k: float(sum(rank_counts[k] for _, rank_counts, _ in ranks)) for k in counts}
        activation_mib = max(mib for _, _, mib in ranks)
    stats = [{**merge_loss_stats(parts), "grad_norm": norm} for parts, norm in steps]
    return {
        **{k: float(np.mean([s[k] for s in stats])) for k in stats[0]},
        **counts,
        "update_activation_mib": activation_mib,
        **cuda,
        **mismatch,
    }


def _lockstep_padding(plan: list[list[list[list[int]]]], shard: UpdateShard) -> list[list[int]]:
    """How many padding forwards this rank runs before each mini-batch of ``plan`` so
    that every rank runs as many forwards as the busiest one (one gather per update)."""
    counts = [[len(forwards) for forwards in epoch] for epoch in plan]
    ranks = shard.gather(counts)
    return [
        [max(rank[e][m] for rank in ranks) - mine for m, mine in enumerate(epoch)]
        for e, epoch in enumerate(counts)
    ]


def padding_forward(
    policy: TrainablePolicy, batch: UpdateBatch, config: PPOConfig, temperature: float
) -> int:
    """One forward and backward that changes no gradient: this rank's shortest row, its
    loss times 0 (the forward and the backward are collectives of a sharded learner,
    which every rank must run as often as the others). Returns the positions run."""
    sizes = [len(c) + len(r) for c, r in zip(batch.contexts, batch.responses, strict=True)]
    row = int(np.argmin(sizes))
    out = _logprobs(policy, [batch.contexts[row]], [batch.responses[row]], config, temperature)
    (out.logp_B_T.sum() * 0.0).backward()
    return out.tokens_computed


def _check_finite_forward(
    policy: TrainablePolicy,
    batch: UpdateBatch,
    config: PPOConfig,
    temperature: float,
    shard: UpdateShard | None,
    steps: int,
) -> None:
    """Refuse finite weights the update made too large to use: one forward of the
    batch's shortest row must give finite log-probs (weights near 1e30 overflow in the
    first matrix product, and every sample would be NaN)."""
    sizes = [len(c) + len(r) for c, r in zip(batch.contexts, batch.responses, strict=True)]
    finite = True
    if sizes:
        row = int(np.argmin(sizes))
        with torch.no_grad():
            out = _logprobs(
                policy, [batch.contexts[row]], [batch.responses[row]], config, temperature
            )
        finite = bool(torch.isfinite(out.logp_B_T[out.mask_B_T > 0]).all())
    if shard is not None:  # every rank decides alike
        finite = all(shard.gather(finite))
    if not finite:
        raise DivergedUpdateError(
            f"the policy's log-probabilities are not finite after the update's {steps} "
            "optimiser steps (its weights overflow a forward)"
        )


def _forwards(batch: UpdateBatch, rows: list[int], config: PPOConfig) -> list[list[int]]:
    """The rows of each forward of one mini-batch, at most ``max_tokens_per_batch``
    positions each (a longer row alone): tree, groups cut at subtree boundaries; rows,
    packed greedily in the mini-batch's (shuffled) order."""
    contexts = [batch.contexts[i] for i in rows]
    responses = [batch.responses[i] for i in rows]
    if config.update == "tree":
        groups = split_rows(contexts, responses, config.max_tokens_per_batch)
    else:
        sizes = [len(c) + len(r) for c, r in zip(contexts, responses, strict=True)]
        groups = token_budget_groups(sizes, config.max_tokens_per_batch)
    return [[rows[g] for g in group] for group in groups]


def _minibatch_loss(
    policy: TrainablePolicy,
    reference: TrainablePolicy | None,
    batch: UpdateBatch,
    rows: list[int],
    config: PPOConfig,
    *,
    scale: int,
    temperature: float,
    is_weight_B_T: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float], int]:
    """The loss of ``rows`` (their slice of the batch-wide weights times ``scale``, the
    number of mini-batches), its statistics and the positions its forward ran."""
    contexts = [batch.contexts[i] for i in rows]
    responses = [batch.responses[i] for i in rows]
    out = _logprobs(policy, contexts, responses, config, temperature)
    logp_B_T, mask_B_T = out.logp_B_T, out.mask_B_T
    ref = None
    if reference is not None:
        with torch.no_grad():
            ref = _logprobs(reference, contexts, responses, config, temperature).logp_B_T
    device, width = logp_B_T.device, logp_B_T.shape[1]
    loss, info = ppo_clip_loss(
        logp_B_T,
        batch.old_logp_B_T[rows, :width].to(device),
        batch.adv_B[rows].to(device),
        mask_B_T,
        batch.weight_B_T[rows, :width].to(device) * scale,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        clip_factor_B=None if batch.clip_factor_B is None else batch.clip_factor_B[rows].to(device),
        ref_logp_B_T=ref,
        kl_coef=config.kl_coef,
        kl_estimator=config.kl_estimator,
        is_weight_B_T=None if is_weight_B_T is None else is_weight_B_T[rows, :width].to(device),
    )
    # the policy's entropy on the same tokens, a mean over them like the loss's statistics
    info["entropy"] = float(out.entropy_B_T.sum().item()) / max(info["n_tokens"], 1.0)
    return loss, info, out.tokens_computed


def _logprobs(
    policy: TrainablePolicy,
    contexts: list[list[int]],
    responses: list[list[int]],
    config: PPOConfig,
    temperature: float,
) -> LayoutLogprobs:
    """Log-probs, entropies and positions run, in the configured layout."""
    if config.update == "tree":
        return policy.tree_logprobs(contexts, responses, temperature=temperature)
    return policy.packed_logprobs(contexts, responses, temperature=temperature)


SUMMED_STATS = frozenset({"loss", "pg_loss", "kl_loss", "n_tokens"})
"""Loss statistics that add up over the forwards of one step; the others are means over
tokens (``ppo_clip_loss``) and are combined weighted by ``n_tokens``."""


def merge_loss_stats(parts: list[dict[str, float]]) -> dict[str, float]:
    """One optimiser step's statistics from those of its forwards."""
    if len(parts) == 1:
        return dict(parts[0])
    tokens = sum(p["n_tokens"] for p in parts)
    merged = {}
    for key in parts[0]:
        values = [p[key] for p in parts]
        if key in SUMMED_STATS:
            merged[key] = float(sum(values))
        else:
            weights = [p["n_tokens"] for p in parts]
            merged[key] = float(np.dot(values, weights) / max(tokens, 1.0))
    return merged


def update_token_counts(batch: UpdateBatch, epochs: int) -> dict[str, float]:
    """``update_tokens_rows`` and ``update_tokens_unique`` of ``epochs`` passes over
    ``batch`` (see the module docstring)."""
    sequences = [[*c, *r] for c, r in zip(batch.contexts, batch.responses, strict=True)]
    trees: dict[int, list[list[int]]] = {}
    for sequence, tree in zip(sequences, batch.tree_B.tolist(), strict=True):
        trees.setdefault(int(tree), []).append(sequence)
    return {
        "update_tokens_rows": float(epochs * sum(len(s) for s in sequences)),
        "update_tokens_unique": float(epochs * sum(trie_size(t) for t in trees.values())),
    }


def _clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip the gradients' total norm to ``max_norm`` (0: leave them) and return the
    norm before clipping. (torch's ``clip_grad_norm_`` with 0 would zero them.)"""
    if max_norm > 0:
        return float(_whole(torch.nn.utils.clip_grad_norm_(parameters, max_norm)))
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    if any(hasattr(g, "full_tensor") for g in grads):  # FSDP2 shards: the global norm
        return float(_whole(torch.nn.utils.get_total_norm(grads)))
    norms = torch.stack([torch.linalg.vector_norm(g) for g in grads])
    return float(torch.linalg.vector_norm(norms))


def _whole(value: torch.Tensor) -> torch.Tensor:
    """A norm computed on FSDP2-sharded gradients (a DTensor replicated on every rank) as
    a plain tensor; any other tensor unchanged."""
    full_tensor = getattr(value, "full_tensor", None)
    return value if full_tensor is None else full_tensor()
