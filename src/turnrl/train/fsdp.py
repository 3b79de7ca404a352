"""FSDP2 sharding of the learner over torchrun ranks (``train.sharding = "fsdp2"``).

``torch.distributed.fsdp.fully_shard`` (FSDP2) splits every parameter of the learner,
its gradients and its AdamW state over the ranks (dim 0, one shard per rank): each
rank holds ``1/N`` of them between forwards. What FSDP2 asks of its caller, and how
turnrl meets it (docs/distributed.md):

* **every forward is a collective** (the all-gather of a module's parameters; every
  backward a reduce-scatter of its gradients), so all ranks must run the same number
  of forwards and backwards, in the same order. The ranks sample their own episodes,
  of different lengths, so sampling never touches the sharded learner: once per step,
  after the update, every rank gathers the full trainable weights into a **sampling
  copy** (:meth:`ShardedLearner.gather`: ``DTensor.full_tensor()``, what
  ``get_model_state_dict(full_state_dict=True)`` does, restricted to the trainable
  tensors: frozen base weights of a LoRA model never change). Rollouts, evaluation
  and information gain use that copy; it is what verl calls a rollout engine separate
  from the sharded actor. In the update, a rank with fewer forwards in a mini-batch
  pads with zero-weight forwards (:func:`turnrl.train.update.ppo.ppo_update` with
  ``UpdateShard.lockstep``), which change no gradient;
* **it averages gradients**; turnrl's loss weights already hold the global batch's
  normaliser, so the gradient of one process is the **sum** over ranks: the divide
  factor is set to 1, with sum-only collectives (gloo has no pre-multiplied sum);
* **the optimiser sees sharded parameters**: AdamW is rebuilt over them, and its
  state is split from (:func:`shard_optimizer`) and gathered to
  (:meth:`ShardedLearner.full_optimizer_state`) the format one process writes, so a
  checkpoint is the same file whatever the sharding (resume with or without it).

Gradient clipping needs nothing: ``clip_grad_norm_`` on DTensor gradients returns the
global norm (replicated on every rank). The frozen KL reference is not sharded (no
gradient, no optimiser state: sharding it would save memory but make its forwards
collectives too).

Where it departs from torchtune/TRL's FSDP2 recipes: each rank keeps the sampling copy
(one full set of weights) beside its shards, so a full fine-tune with AdamW holds
1 + 4/N weight-sized tensors per rank instead of 4: FSDP2 here saves the gradients'
and AdamW's memory, not the weights'. A model that does not fit one device for
sampling needs a separate engine (vLLM, ``policy.backend``), which then gets its
weights from the copy.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from turnrl.policy import HFPolicy

__all__ = ["ShardedLearner", "shard_blocks", "shard_optimizer"]


def shard_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules sharded one by one: the transformer blocks transformers names in
    ``_no_split_modules`` (through a peft wrapper), found in ``model``; the root gets
    what is left (embeddings, final norm, the head)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def _full(value: Any) -> Any:
    """``value`` with every DTensor gathered whole (a collective per DTensor)."""
    if isinstance(value, DTensor):
        return value.full_tensor()
    if isinstance(value, dict):
        return {k: _full(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_full(v) for v in value]
    return value


def shard_optimizer(
    optimizer: torch.optim.Optimizer, parameters: list[torch.nn.Parameter]
) -> torch.optim.Optimizer:
    """A new optimiser of ``optimizer``'s class and settings over ``parameters`` (the same
    parameters, sharded, in the same order), holding ``optimizer``'s state split like
    them. Every rank holds the same full state already (it was broadcast), so each
    takes its own shard locally (no communication)."""
    state = optimizer.state_dict()
    for index, per_param in state["state"].items():
        target = parameters[index]
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor) and value.shape == target.shape:
                per_param[key] = distribute_tensor(
                    value.to(target.device),
                    target.device_mesh,
                    target.placements,
                    src_data_rank=None,
                )
    accepted = inspect.signature(type(optimizer)).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted and k != "params"}
    out = type(optimizer)(parameters, **defaults)
    out.load_state_dict(state)  # the groups' settings too
    return out


@dataclass
class ShardedLearner:
    """The learner sharded in place with FSDP2, and its full sampling copy."""

    learner: HFPolicy
    """The policy the update trains; its parameters are DTensors (shards)."""
    full: HFPolicy
    """A plain copy with the whole model: what samples, evaluates and is saved."""

    @classmethod
    def shard(cls, policy: HFPolicy) -> ShardedLearner:
        """Copy ``policy`` (whole) for sampling, then shard ``policy``'s model in place:
        each transformer block, then the root; gradients summed over ranks. Call it on
        every rank at the same point, after every rank holds the same weights."""
        full = HFPolicy(
            copy.deepcopy(policy.model), policy.tokenizer, end_of_turn=policy.end_of_turn
        )
        model = policy.model
        for block in shard_blocks(model):
            fully_shard(block)
        fully_shard(model)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)  # the sum; turnrl's weights normalise
                module.set_force_sum_reduction_for_comms(True)  # gloo: no PREMUL_SUM
        return cls(policy, full)

    def gather(self) -> None:
        """The learner's current trainable weights into the sampling copy, whole (one
        all-gather per tensor: every rank calls it at the same point)."""
        pairs = zip(
            self.learner.model.named_parameters(), self.full.model.named_parameters(), strict=True
        )
        with torch.no_grad():
            for (name, shard), (full_name, whole) in pairs:
                assert name == full_name, (name, full_name)
                if shard.requires_grad:
                    whole.copy_(shard.full_tensor())

    def full_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """``optimizer``'s state dict with every shard gathered whole: the format one
        process saves (a collective: every rank calls it at the same point)."""
        return _full(optimizer.state_dict())
