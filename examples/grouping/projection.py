"""Where does a policy-gradient loss push one behaviour? The gradient projected on it.

A loss ``L`` over a batch of turns moves the parameters along ``-grad L``. Its
first-order effect on a behaviour ``b(theta)`` (here: the mean log-probability of
opening a response with a given token sequence, e.g. ``<call>``, over a set of
contexts) is ``-grad L . grad b``: positive means one small gradient step makes
the behaviour more likely. Because ``L`` is a weighted sum over response tokens
of terms in their log-probs, this splits exactly over rows:

    -grad L . d = - sum_{b,t} dL/dlogp[b,t] * (grad logp[b,t] . d),   d = grad b

so one forward pass gives ``D[b,t] = grad logp[b,t] . d`` for every token of a
batch (:func:`directional_logprobs`, by double backward), and the projection of
any loss on that batch (any estimator, aggregation or row selection) is a
weighted sum of ``D`` with the loss's own ``dL/dlogp`` (:func:`loss_logp_gradient`,
which runs the trainer's :func:`~turnrl.train.update.loss.ppo_clip_loss`).

This is a plain-gradient (SGD) direction at the current parameters: it ignores
gradient clipping, Adam's per-parameter scaling and the PPO clip. Adam acts from
the first step (with fresh moments that step is close to ``lr * sign(g)`` per
coordinate), so the trainer's update need not move the behaviour the gradient's
way; ``examples/grouping/adam.py`` measures the actual updates' projection.

Part of the grouping experiment (``gradient.py`` beside it, docs/grouping-experiment.md),
not of the library: nothing in ``turnrl`` uses it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from turnrl.policy import HFPolicy
from turnrl.train.update.loss import ppo_clip_loss

Tensor = torch.Tensor


@contextlib.contextmanager
def eager_attention(policy: HFPolicy) -> Iterator[None]:
    """Switch the model to eager attention (torch's fused CPU attention has no double
    backward); restored on exit. The two are the same function up to float rounding."""
    model = policy.model
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def trainable_parameters(policy: HFPolicy) -> list[torch.nn.Parameter]:
    return [p for p in policy.parameters() if p.requires_grad]


def opening_direction(
    policy: HFPolicy, contexts: Sequence[Sequence[int]], opening: Sequence[int]
) -> list[Tensor]:
    """``d = grad_theta mean_c log pi(opening | c)``, one tensor per trainable parameter.

    ``opening`` is the token sequence whose probability as the start of a
    response is measured (e.g. the ids of ``"<call>"``).
    """
    if not contexts or not opening:
        raise ValueError("opening_direction needs at least one context and one opening token")
    params = trainable_parameters(policy)
    logp_B_T, _ = policy.response_logprobs(contexts, [list(opening)] * len(contexts))
    objective = logp_B_T.sum() / len(contexts)
    return list(torch.autograd.grad(objective, params))


def directional_logprobs(
    policy: HFPolicy,
    contexts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    direction: Sequence[Tensor],
) -> tuple[Tensor, Tensor, Tensor]:
    """``(logp_B_T, D_B_T, mask_B_T)``: each response token's log-prob and its derivative
    along ``direction`` (``D = J d`` with ``J = d logp / d theta``), all detached.

    ``J d`` is obtained as ``d/du (d . J^T u)`` at ``u = 0``: one forward and two
    backward passes for the whole batch, whatever the number of losses projected later.
    """
    params = trainable_parameters(policy)
    if len(direction) != len(params):
        raise ValueError(f"direction has {len(direction)} tensors, the policy {len(params)}")
    with eager_attention(policy), torch.enable_grad():
        logp_B_T, mask_B_T = policy.response_logprobs(contexts, responses)
        u_B_T = torch.zeros_like(logp_B_T, requires_grad=True)
        vjp = torch.autograd.grad(logp_B_T, params, grad_outputs=u_B_T, create_graph=True)
        inner = sum((g * d).sum() for g, d in zip(vjp, direction, strict=True))
        (jd_B_T,) = torch.autograd.grad(inner, u_B_T)
    return logp_B_T.detach(), (jd_B_T * mask_B_T).detach(), mask_B_T.detach()


def loss_logp_gradient(
    logp_B_T: Tensor,
    adv_B: Tensor,
    mask_B_T: Tensor,
    weight_B_T: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> Tensor:
    """``dL/dlogp[b,t]`` of the trainer's PPO-clip loss at the behaviour policy (ratio 1),
    for per-token aggregation weights ``weight_B_T`` (see ``turnrl.train.update.loss``)."""
    logp = logp_B_T.detach().clone().requires_grad_(True)
    loss, _ = ppo_clip_loss(
        logp,
        logp_B_T.detach(),
        adv_B,
        mask_B_T,
        weight_B_T,
        clip_low=clip_low,
        clip_high=clip_high,
    )
    (grad_B_T,) = torch.autograd.grad(loss, logp)
    return grad_B_T


def projection(grad_logp_B_T: Tensor, jd_B_T: Tensor, rows: Tensor | None = None) -> float:
    """``-grad L . d`` from ``dL/dlogp`` and ``J d``, over all rows or the selected ``rows``
    (a boolean mask over ``B``): the first-order change of the behaviour per unit step."""
    contribution_B = -(grad_logp_B_T.double() * jd_B_T.double()).sum(dim=1)
    if rows is not None:
        contribution_B = contribution_B[rows]
    return float(contribution_B.sum())
