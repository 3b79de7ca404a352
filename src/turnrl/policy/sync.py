"""One call moves the learner's weights to a sampler: :func:`push_weights`.

Samplers differ in what they hold, so the call dispatches on the kind:

* the learner itself (``policy.backend = "hf"``): it samples with the weights it trains,
  nothing moves;
* another in-process policy with ``load_state_dict`` (an ``HFPolicy`` copy): the
  learner's state dict (the adapters only, for LoRA) is loaded into it;
* a rollout pool (Ray workers) or a gateway: their own ``push_weights(state_dict,
  version)`` / ``load_weights(state_dict, version)``; the workers hold the same model
  (adapters included), so they get the learner's state dict;
* a vLLM engine (:class:`turnrl.policy.vllm.VLLMPolicy`): the engine holds a plain model,
  so it gets FULL weights under the transformers names, a LoRA learner's adapters merged
  into them (:func:`full_weights`), reloaded in place.
* a vLLM server (:class:`turnrl.policy.vllm_server.VLLMServerPolicy`): it takes the
  learner itself (``load_learner``) and moves what the server accepts: a LoRA learner's
  adapters, else full weights (through a directory both can read).

``version`` is the number of updates the weights include; samplers that report a
version (records' ``policy_version``) report this one afterwards.
"""

from __future__ import annotations

from typing import Any

import torch

from turnrl.policy import lora

__all__ = ["full_weights", "push_weights"]


def full_weights(learner: Any) -> dict[str, torch.Tensor]:
    """Every weight of ``learner``'s model under its transformers names, detached; a LoRA
    model's adapters are merged into the base weights (on a copy: the learner keeps its
    adapters)."""
    model = learner.model
    if lora.is_adapter_model(model):
        model = lora.merged_copy(model)
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


def push_weights(learner: Any, sampler: Any, version: int) -> None:
    """Give ``sampler`` the learner's current weights as ``version`` (see the module
    docstring for what each kind of sampler receives)."""
    if sampler is learner:
        return
    receive_learner = getattr(sampler, "load_learner", None)
    receive_full = getattr(sampler, "load_full_weights", None)
    if receive_learner is not None:  # a vLLM server
        receive_learner(learner, version)
    elif receive_full is not None:  # a vLLM engine
        receive_full(full_weights(learner), version)
    elif hasattr(sampler, "push_weights"):  # a rollout pool
        sampler.push_weights(learner.state_dict(), version)
    elif hasattr(sampler, "swap_policy") and hasattr(sampler, "load_weights"):  # a gateway
        sampler.load_weights(learner.state_dict(), version)
    elif hasattr(sampler, "load_state_dict"):  # an in-process copy
        sampler.load_state_dict(learner.state_dict())
    else:
        raise TypeError(
            f"push_weights: {type(sampler).__name__} takes no weights (it has none of "
            "load_learner, load_full_weights, push_weights, load_weights, load_state_dict)"
        )
