"""``train.precision = "bf16-mixed"``: the training forwards run under bfloat16
autocast, the weights, gradients and optimiser state stay float32, log-probs are
float32; the loss and gradients stay close to float32's, and a resumed run continues
exactly.

Tolerances (tiny Qwen2, the batch of tests/test_memory_savers.py, temperature 0.7;
measured over rows/tree, full weights/LoRA, with and without checkpointing + chunks):
bf16-mixed minus fp32 was at most 3.7e-3 in any log-prob, 7.8e-4 in the loss, 6.0e-3
in any gradient entry (4.5e-3 of the largest entry) and 6.3e-3 in the gradient's
relative norm. The tests allow about 5x that: 2e-2 per log-prob, 5e-3 in the loss,
2e-2 of the largest gradient entry per entry and 3e-2 relative norm
(docs/memory.md).
"""

from __future__ import annotations

import pytest
import torch

from test_memory_savers import ADVANTAGE, LAYOUTS, _logprobs, _policy
from turnrl.config_toml import load_config
from turnrl.errors import ConfigError
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.policy.memory_savers import memory_savers
from turnrl.train.config import RunConfig
from turnrl.train.iterate.config import IterateConfig
from turnrl.train.online.trainer import OnlineTrainer
from turnrl.train.validate import validate

torch.set_num_threads(1)

LOGP_TOL = 2e-2
LOSS_TOL = 5e-3
GRAD_ENTRY_TOL = 2e-2
"""Per gradient entry, as a fraction of the largest entry's magnitude."""
GRAD_NORM_TOL = 3e-2
"""``||g_bf16 - g_fp32|| / ||g_fp32||``."""


def _loss_and_grads(
    policy: HFPolicy, layout: str, **savers
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, set[torch.dtype]]:
    """(log-probs, loss, flat gradient, dtypes of the output layer's logits) of one
    forward and backward with ``savers``."""
    parameters = list(policy.parameters())
    for p in parameters:
        p.grad = None
    logit_dtypes: set[torch.dtype] = set()
    head = policy.model.get_output_embeddings()
    hook = head.register_forward_hook(lambda _m, _i, out: logit_dtypes.add(out.dtype))
    try:
        with memory_savers(policy, **savers):
            logp_B_T, mask_B_T = _logprobs(policy, layout)
        weight_B_T = torch.tensor(ADVANTAGE)[:, None] * mask_B_T
        loss = -(logp_B_T * weight_B_T).sum() / mask_B_T.sum()
        loss.backward()
    finally:
        hook.remove()
    assert all(p.grad.dtype == torch.float32 for p in parameters)
    grads = torch.cat([p.grad.flatten() for p in parameters])
    return logp_B_T.detach(), loss.detach(), grads, logit_dtypes


@pytest.mark.parametrize(
    "savers", [{}, {"gradient_checkpointing": True, "logprob_chunk_tokens": 4}]
)
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bf16_mixed_is_close_to_fp32(layout, lora, savers) -> None:
    torch.manual_seed(0)  # the LoRA adapters' initialisation
    policy = _policy(lora)
    logp, loss, grads, plain_dtypes = _loss_and_grads(policy, layout)
    mixed = _loss_and_grads(policy, layout, precision="bf16-mixed", **savers)
    logp_mixed, loss_mixed, grads_mixed, mixed_dtypes = mixed
    assert plain_dtypes == {torch.float32}
    assert mixed_dtypes == {torch.bfloat16}  # autocast did act on the output layer
    assert logp_mixed.dtype == loss_mixed.dtype == torch.float32
    assert 0 < (logp_mixed - logp).abs().max() < LOGP_TOL  # bf16 rounding, not a no-op
    assert (loss_mixed - loss).abs() < LOSS_TOL
    assert (grads_mixed - grads).abs().max() < GRAD_ENTRY_TOL * grads.abs().max()
    assert (grads_mixed - grads).norm() < GRAD_NORM_TOL * grads.norm()
    # master weights untouched and autocast off again after the update
    assert policy.autocast_dtype is None
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    assert _loss_and_grads(policy, layout)[3] == {torch.float32}


def test_memory_savers_refuse_bf16_weights_and_unknown_precisions() -> None:
    policy = build_tiny_policy(0)
    policy.model.to(torch.bfloat16)
    with pytest.raises(ValueError, match="float32 master weights"):
        memory_savers(policy, precision="bf16-mixed").__enter__()
    with pytest.raises(ValueError, match="precision 'fp16'"):
        memory_savers(policy, precision="fp16").__enter__()
    assert policy.autocast_dtype is None


def test_bf16_mixed_needs_float32_weights_in_the_config() -> None:
    def check(config_class, *overrides: str) -> None:
        validate(load_config(config_class, None, list(overrides)), overrides=overrides)

    check(RunConfig, "train.precision=bf16-mixed")
    check(IterateConfig, "improve.precision=bf16-mixed")
    for config_class, section in ((RunConfig, "train"), (IterateConfig, "improve")):
        with pytest.raises(ConfigError, match=rf"{section}\.precision: 'bf16-mixed' keeps"):
            check(config_class, f"{section}.precision=bf16-mixed", "policy.dtype=bfloat16")
    with pytest.raises(ConfigError, match=r"train\.precision"):
        check(RunConfig, "train.precision=fp16")


def test_resumed_bf16_mixed_run_equals_uninterrupted_run(
    tmp_path, tiny_train, read_metrics
) -> None:
    """3 steps straight, or stopped after the checkpoint of step 2 and resumed: the same
    metrics and final weights, master weights and AdamW moments in float32."""
    settings = (
        "train.precision=bf16-mixed",
        "policy.lora_rank=4",
        "train.steps=3",
        "env.env_kwargs={max_turns = 2, turn_cost = 0.0}",  # short episodes: sampling is cheap
    )
    straight = OnlineTrainer(tiny_train(tmp_path / "a", *settings), quiet=True).run()
    crashed = tmp_path / "b"
    OnlineTrainer(tiny_train(crashed, *settings), quiet=True).run(stop_after=2)
    resumed = OnlineTrainer(tiny_train(crashed, *settings), resume=True, quiet=True).run()
    assert read_metrics(resumed) == read_metrics(straight)
    assert [row["step"] for row in read_metrics(resumed)] == [0, 1, 2, 3]
    a = torch.load(straight / "checkpoints" / "step-000003.pt", weights_only=True)
    b = torch.load(resumed / "checkpoints" / "step-000003.pt", weights_only=True)
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    # master weights and optimiser state (AdamW's moments) are float32 after the steps
    assert {v.dtype for v in a["model"].values()} == {torch.float32}
    moments = [t for s in a["optimizer"]["state"].values() for t in s.values() if t.dim()]
    assert moments and {t.dtype for t in moments} == {torch.float32}
