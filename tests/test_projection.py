"""The gradient projection of the grouping experiment (``examples/grouping/projection.py``):
J d by double backward, dL/dlogp from the trainer's loss, and their product equal to the
loss gradient dotted with the direction."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from turnrl.policy import build_tiny_policy
from turnrl.train.update.loss import aggregation_weights, ppo_clip_loss

PATH = Path(__file__).resolve().parents[1] / "examples" / "grouping" / "projection.py"
_spec = importlib.util.spec_from_file_location("grouping_projection", PATH)
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _module
_spec.loader.exec_module(_module)
directional_logprobs = _module.directional_logprobs
loss_logp_gradient = _module.loss_logp_gradient
opening_direction = _module.opening_direction
projection = _module.projection
trainable_parameters = _module.trainable_parameters

torch.set_num_threads(1)


def small_batch(policy):
    ctx = policy.encode_initial([{"role": "user", "content": "Compute 3+4."}])
    longer = ctx + policy.encode_observation({"role": "tool", "content": "7"})
    contexts = [ctx, ctx, longer]
    responses = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    return contexts, responses


def dot(a, b) -> float:
    return float(sum((x.double() * y.double()).sum() for x, y in zip(a, b, strict=True)))


def test_directional_logprobs_is_the_jacobian_times_the_direction() -> None:
    policy = build_tiny_policy(0)
    contexts, responses = small_batch(policy)
    params = trainable_parameters(policy)
    direction = [torch.randn_like(p, generator=torch.Generator().manual_seed(i))
                 for i, p in enumerate(params)]  # fmt: skip
    logp, jd, mask = directional_logprobs(policy, contexts, responses, direction)
    want_logp, want_mask = policy.response_logprobs(contexts, responses)
    torch.testing.assert_close(logp, want_logp.detach(), atol=1e-5, rtol=0)
    assert torch.equal(mask, want_mask)
    assert torch.all(jd[mask == 0] == 0)
    coefficients = torch.randn(logp.shape, generator=torch.Generator().manual_seed(9)) * mask
    logp_grad, _ = policy.response_logprobs(contexts, responses)
    grads = torch.autograd.grad((coefficients * logp_grad).sum(), params)
    assert float((coefficients * jd).sum()) == pytest.approx(dot(grads, direction), rel=1e-4)
    assert policy.model.config._attn_implementation == "sdpa"  # restored afterwards


def test_opening_direction_is_the_gradient_of_the_opening_log_prob() -> None:
    policy = build_tiny_policy(1)
    contexts, _ = small_batch(policy)
    opening = policy.tokenizer("<call>", add_special_tokens=False)["input_ids"]

    def behaviour() -> float:
        with torch.no_grad():
            logp, _ = policy.response_logprobs(contexts, [opening] * len(contexts))
        return float(logp.sum()) / len(contexts)

    d = opening_direction(policy, contexts, opening)
    before, eps = behaviour(), 1e-3 / dot(d, d) ** 0.5
    with torch.no_grad():
        for p, g in zip(trainable_parameters(policy), d, strict=True):
            p.add_(eps * g)
    # a step eps along d raises the behaviour by eps * |d|^2 to first order
    assert behaviour() - before == pytest.approx(eps * dot(d, d), rel=2e-2)
    with pytest.raises(ValueError, match="at least one context"):
        opening_direction(policy, [], opening)


def test_loss_gradient_at_ratio_one_is_minus_weight_times_advantage() -> None:
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    weights = aggregation_weights(mask, "token-mean")  # 1/3 per token
    adv = torch.tensor([0.6, -1.5])
    grad = loss_logp_gradient(logp, adv, mask, weights)
    want = torch.tensor([[-0.2, -0.2, 0.0], [0.5, 0.0, 0.0]])
    torch.testing.assert_close(grad, want, atol=1e-7, rtol=0)
    jd = torch.tensor([[1.0, 2.0, 7.0], [4.0, 9.0, 9.0]])
    # -(-0.2 * 1 - 0.2 * 2) = 0.6 from row 0; -(0.5 * 4) = -2 from row 1
    assert projection(grad, jd) == pytest.approx(-1.4, abs=1e-6)
    assert projection(grad, jd, rows=torch.tensor([True, False])) == pytest.approx(0.6, abs=1e-6)


@pytest.mark.parametrize("aggregation", ["token-mean", "rollout-mean"])
def test_projection_equals_the_loss_gradient_dotted_with_the_direction(aggregation) -> None:
    policy = build_tiny_policy(2)
    contexts, responses = small_batch(policy)
    opening = policy.tokenizer("<call>", add_special_tokens=False)["input_ids"]
    d = opening_direction(policy, contexts[:1], opening)
    logp, jd, mask = directional_logprobs(policy, contexts, responses, d)
    adv = torch.tensor([1.2, -0.4, 0.7])
    weights = aggregation_weights(mask, aggregation, torch.tensor([0, 1, 1]))
    ours = projection(loss_logp_gradient(logp, adv, mask, weights), jd)
    # the same through the real loss and a real backward pass
    live, _ = policy.response_logprobs(contexts, responses)
    loss, _ = ppo_clip_loss(live, live.detach(), adv, mask, weights)
    grads = torch.autograd.grad(loss, trainable_parameters(policy))
    assert ours == pytest.approx(-dot(grads, d), rel=1e-4)
