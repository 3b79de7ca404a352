"""A learned turn-level Q^pi(state, response): a small transformer with a scalar head.

Iterative GRPO's policy-evaluation step (Jiang et al. 2025, arXiv 2511.21638):
log ``(s_i, a_i, G_i)`` with the deployed policy, where ``G_i`` is the Monte Carlo
return of the turn (discounted sum of the rewards from that turn to the end of
the conversation), and fit ``Q^pi(s, a)`` to it by ordinary regression. The state
is the exact context the policy saw (``prompt_ids``), the action the whole turn
(``response_ids``); the model reads ``state ids + response ids`` and a linear head
on the last token's hidden state and the response tokens' mean hidden state
gives the score.

Departures from the paper, and choices it leaves open:

* The backbone is a tiny Qwen2 (``turnrl.policy.tiny``), either freshly
  initialised (``init="fresh"``) or a copy of the policy's own transformer
  (``init="policy"``, "a head on the policy backbone", fine-tuned separately so
  the policy is untouched). The paper fits a reward model on an LLM.
* ``loss="mse"`` standardises the targets (mean/std of the training split) and
  predicts in return units; ``loss="bce"`` (for 0/1 returns) fits a logit and
  predicts a probability. ``"auto"`` picks BCE when every target is 0 or 1.
* The held-out split is by conversation (``group``), never by turn: turns of one
  conversation share their prefix and their return, so a per-turn split would
  leak.
* How good the fit is (held-out rank correlation, calibration, within-state
  ranking) is measured in :mod:`turnrl.train.iterate.qquality`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from turnrl.credit.returns import return_to_go
from turnrl.io import atomic_open, atomic_write_text
from turnrl.table import TurnTable, default_node_id
from turnrl.train.iterate.qquality import q_quality
from turnrl.types import TurnRecord

LOSSES = ("mse", "bce")


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class QExample:
    """One logged ``(state, response, return)``; ``group`` is its conversation id,
    ``state`` a key of its exact decision point (rows sharing it had the same context)."""

    context: list[int]
    response: list[int]
    target: float
    group: str
    state: str = ""


def mc_returns(records: Sequence[TurnRecord], gamma: float = 1.0) -> np.ndarray:
    """Monte Carlo return ``G_t = sum_{j>=t} gamma^(j-t) r_j`` of every record's turn.

    ``records`` are turn records (validated by ``TurnTable``: each trajectory's
    turns are ``0..n-1``); the result is aligned with them.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    table = TurnTable.from_records(list(records), source="<logged turns>")
    return return_to_go(table, gamma)


def q_examples(records: Sequence[TurnRecord], gamma: float = 1.0) -> list[QExample]:
    """Training examples for Q from turn records with ``prompt_ids`` and ``response_ids``.

    Rows without response tokens are skipped (nothing to score).
    """
    returns = mc_returns(records, gamma)
    out = []
    for record, value in zip(records, returns, strict=True):
        if record.prompt_ids is None or record.response_ids is None:
            raise ValueError(
                f"record {record.traj_id!r} turn {record.turn}: "
                "Q needs prompt_ids and response_ids (tokenise the log first)"
            )
        if record.response_ids:
            out.append(
                QExample(
                    list(record.prompt_ids),
                    list(record.response_ids),
                    float(value),
                    record.traj_id,
                    str(default_node_id(record.task_id, record.prompt_ids, None)),
                )
            )
    return out


def split_by_group(
    examples: Sequence[QExample], holdout_fraction: float, seed: int
) -> tuple[list[QExample], list[QExample]]:
    """Split whole conversations into (train, held-out).

    At least one conversation is held out when ``holdout_fraction > 0`` and there
    are two or more; at least one is always kept for training.
    """
    if not 0.0 <= holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in [0, 1), got {holdout_fraction}")
    groups = sorted({e.group for e in examples})
    n_held = 0
    if holdout_fraction > 0 and len(groups) >= 2:
        n_held = min(len(groups) - 1, max(1, round(holdout_fraction * len(groups))))
    order = np.random.default_rng(seed).permutation(len(groups))
    held = {groups[i] for i in order[:n_held]}
    train = [e for e in examples if e.group not in held]
    heldout = [e for e in examples if e.group in held]
    return train, heldout


# --------------------------------------------------------------------------- model


class QModel(nn.Module):
    """A transformer backbone (``input_ids -> last_hidden_state``) and a scalar head.

    The head reads the hidden state of the last token concatenated with the mean
    hidden state over the response tokens. The last token alone sees the whole
    sequence, but a small backbone fitted on a few hundred turns then mostly
    scores the (long) state and hardly the (short) response; the response mean
    gives the head a direct view of the action, which is what the ``q``
    estimator needs to tell candidates for one state apart.
    """

    def __init__(self, backbone: nn.Module, hidden: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(2 * hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(
        self, ids_B_L: torch.Tensor, mask_B_L: torch.Tensor, start_B: torch.Tensor
    ) -> torch.Tensor:
        """Raw score ``(B,)``; rows right-padded, the response of row b starting at
        position ``start_B[b]`` (an empty response falls back to the last token)."""
        batch, length = ids_B_L.shape
        hidden_B_L_H = self.backbone(
            input_ids=ids_B_L,
            attention_mask=mask_B_L,
            position_ids=torch.arange(length, device=ids_B_L.device).expand(batch, length),
            use_cache=False,
        ).last_hidden_state.float()
        end_B = mask_B_L.sum(dim=1)
        last_B_H = hidden_B_L_H[torch.arange(batch, device=ids_B_L.device), end_B - 1]
        positions_L = torch.arange(length, device=ids_B_L.device)
        start_B = torch.minimum(start_B, end_B - 1)
        in_response_B_L = (positions_L[None, :] >= start_B[:, None]) & (
            positions_L[None, :] < end_B[:, None]
        )
        weights_B_L = in_response_B_L.float() / in_response_B_L.sum(dim=1, keepdim=True)
        response_B_H = (weights_B_L[:, :, None] * hidden_B_L_H).sum(dim=1)
        return self.head(torch.cat([last_B_H, response_B_H], dim=-1)).squeeze(-1)


@dataclass
class QFunction:
    """A ``QModel`` plus how its raw output maps to return units.

    ``loss="mse"``: ``Q = raw * target_std + target_mean``. ``loss="bce"``:
    ``Q = sigmoid(raw)``. ``pad_id`` fills padding (masked out anyway).
    """

    model: QModel
    loss: str
    pad_id: int = 0
    target_mean: float = 0.0
    target_std: float = 1.0
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"unknown Q loss {self.loss!r}; known: {', '.join(LOSSES)}")

    def _batch(
        self, contexts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if len(contexts) != len(responses):
            raise ValueError(f"{len(contexts)} contexts but {len(responses)} responses")
        rows = [[*c, *r] for c, r in zip(contexts, responses, strict=True)]
        for i, row in enumerate(rows):
            if not row:
                raise ValueError(f"row {i}: empty state and response")
        length = max(len(r) for r in rows)
        ids_B_L = torch.full((len(rows), length), self.pad_id, dtype=torch.long)
        mask_B_L = torch.zeros((len(rows), length), dtype=torch.long)
        for i, row in enumerate(rows):
            ids_B_L[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask_B_L[i, : len(row)] = 1
        device = next(self.model.parameters()).device
        start_B = torch.tensor([len(c) for c in contexts], dtype=torch.long)
        return ids_B_L.to(device), mask_B_L.to(device), start_B.to(device)

    def raw(
        self, contexts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        """Raw head outputs ``(B,)`` (differentiable): standardised value or logit."""
        return self.model(*self._batch(contexts, responses))

    def to_output(self, raw_B: torch.Tensor) -> torch.Tensor:
        """Raw outputs in return units (MSE) or as probabilities (BCE)."""
        if self.loss == "bce":
            return torch.sigmoid(raw_B)
        return raw_B * self.target_std + self.target_mean

    @torch.no_grad()
    def predict(
        self,
        contexts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        *,
        batch_size: int = 64,
    ) -> np.ndarray:
        """Q of each ``(context, response)`` pair, in batches, without gradients."""
        was_training = self.model.training
        self.model.eval()
        out = []
        for start in range(0, len(contexts), batch_size):
            raw_B = self.raw(
                contexts[start : start + batch_size], responses[start : start + batch_size]
            )
            out.append(self.to_output(raw_B).float().cpu().numpy())
        self.model.train(was_training)
        return np.concatenate(out) if out else np.zeros(0)

    # ------------------------------------------------------------------ saving
    def save(self, directory: str | Path) -> None:
        """Weights and scaling to ``directory/q.pt`` (the backbone's config alongside)."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        meta = {
            "loss": self.loss,
            "pad_id": self.pad_id,
            "target_mean": self.target_mean,
            "target_std": self.target_std,
            "backbone_config": self.model.backbone.config.to_dict(),
            "info": self.info,
        }
        atomic_write_text(path / "q.json", json.dumps(meta, indent=2, default=str))
        with atomic_open(path / "q.pt") as handle:
            torch.save(self.model.state_dict(), handle)

    @classmethod
    def load(cls, directory: str | Path) -> QFunction:
        """Rebuild a ``QFunction`` saved by :meth:`save` (weights only; nothing downloaded)."""
        from transformers import AutoConfig, AutoModel

        path = Path(directory)
        meta = json.loads((path / "q.json").read_text())
        config_dict = dict(meta["backbone_config"])
        config = AutoConfig.for_model(config_dict.pop("model_type"), **config_dict)
        backbone = AutoModel.from_config(config)
        model = QModel(backbone, config.hidden_size)
        model.load_state_dict(torch.load(path / "q.pt", weights_only=True))
        return cls(
            model.eval(),
            meta["loss"],
            pad_id=meta["pad_id"],
            target_mean=meta["target_mean"],
            target_std=meta["target_std"],
            info=meta.get("info", {}),
        )


def build_q_model(
    *,
    init: str,
    seed: int,
    hidden: int = 64,
    layers: int = 2,
    policy: Any = None,
) -> QModel:
    """A fresh tiny-Qwen2 Q model, or one whose backbone copies ``policy``'s transformer.

    ``init="policy"`` needs an ``HFPolicy`` (its causal LM's ``base_model`` is
    deep-copied; ``hidden``/``layers`` are then the policy's). The head starts at
    zero, so an untrained Q predicts the target mean (MSE) or 0.5 (BCE).
    """
    if init == "fresh":
        from turnrl.policy import build_tiny_model, build_tiny_tokenizer

        causal = build_tiny_model(build_tiny_tokenizer(), seed=seed, hidden=hidden, layers=layers)
        backbone = causal.base_model
    elif init == "policy":
        if policy is None:
            raise ValueError("Q init 'policy' needs the policy whose backbone it copies")
        backbone = copy.deepcopy(policy.model.base_model)
        backbone.requires_grad_(True)
    else:
        raise ValueError(f"unknown Q init {init!r}; known: fresh, policy")
    return QModel(backbone.train(), int(backbone.config.hidden_size))


def choose_loss(loss: str, targets: np.ndarray) -> str:
    """``"auto"``: BCE when every target is exactly 0 or 1, else MSE."""
    if loss == "auto":
        targets = np.asarray(targets)
        binary = targets.size > 0 and bool(np.isin(targets, (0.0, 1.0)).all())
        return "bce" if binary else "mse"
    if loss not in LOSSES:
        raise ValueError(f"unknown Q loss {loss!r}; known: auto, {', '.join(LOSSES)}")
    if loss == "bce" and not bool(((targets >= 0) & (targets <= 1)).all()):
        raise ValueError("Q loss 'bce' needs returns in [0, 1]; use 'mse'")
    return loss


# --------------------------------------------------------------------------- fitting


@dataclass
class QFit:
    """What ``fit_q`` returns: the fitted Q and its train/held-out quality."""

    q: QFunction
    train: dict[str, Any]
    heldout: dict[str, Any]
    losses: list[float]

    def metrics(self, prefix: str = "q_") -> dict[str, float]:
        """Scalar metrics (no reliability tables) for ``metrics.jsonl``."""
        out: dict[str, float] = {}
        for split, quality in (("train", self.train), ("heldout", self.heldout)):
            for key, value in quality.items():
                if key != "reliability":
                    out[f"{prefix}{split}_{key}"] = float(value)
        return out


def fit_q(
    model: QModel,
    examples: Sequence[QExample],
    *,
    loss: str = "auto",
    steps: int = 300,
    lr: float = 1e-3,
    batch_size: int = 32,
    holdout_fraction: float = 0.2,
    calibration_bins: int = 10,
    seed: int = 0,
    pad_id: int = 0,
    max_grad_norm: float = 1.0,
) -> QFit:
    """Fit ``model`` to the examples' returns by regression (MSE or BCE).

    Conversations are split into train and held-out first (``split_by_group``);
    ``steps`` AdamW steps on random training mini-batches follow; quality on
    both splits is measured at the end (no early stopping, so the held-out
    numbers are an honest estimate).
    """
    if not examples:
        raise ValueError("no logged turns to fit Q on")
    train, heldout = split_by_group(examples, holdout_fraction, seed)
    targets = np.array([e.target for e in train], dtype=np.float64)
    chosen = choose_loss(loss, np.array([e.target for e in examples]))
    mean = float(targets.mean())
    std = float(targets.std()) if chosen == "mse" and targets.std() > 1e-8 else 1.0
    q = QFunction(model, chosen, pad_id=pad_id, target_mean=mean, target_std=std)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    target_T = torch.as_tensor(targets, dtype=torch.float32)
    losses = []
    model.train()
    for _ in range(steps):
        index = torch.randint(len(train), (min(batch_size, len(train)),), generator=generator)
        rows = [train[i] for i in index.tolist()]
        raw_B = q.raw([e.context for e in rows], [e.response for e in rows])
        y_B = target_T[index].to(raw_B.device)
        if chosen == "bce":
            step_loss = nn.functional.binary_cross_entropy_with_logits(raw_B, y_B)
        else:
            step_loss = nn.functional.mse_loss(raw_B, (y_B - mean) / std)
        optimizer.zero_grad(set_to_none=True)
        step_loss.backward()
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        losses.append(float(step_loss.item()))
    model.eval()

    def quality(split: Sequence[QExample]) -> dict[str, Any]:
        pred = q.predict([e.context for e in split], [e.response for e in split])
        target = np.array([e.target for e in split], dtype=np.float64)
        return q_quality(
            pred,
            target,
            loss=chosen,
            baseline=mean,
            bins=calibration_bins,
            states=[e.state or e.group for e in split],
        )

    q.info = {"n_train": len(train), "n_heldout": len(heldout), "steps": steps}
    return QFit(q, quality(train), quality(heldout), losses)
