"""The warm start's tree layout (``max_tokens_per_batch``): the same loss and gradient
as one per-row forward, however many forwards the token budget cuts a batch into.

The loss is the mean negative log-likelihood per response token of the whole batch,
so every forward divides by the batch's token count, never by its own."""

from __future__ import annotations

import pytest
import torch

from turnrl.envs import demonstration
from turnrl.envs.calculator import make_task
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.policy.tree_layout import split_rows
from turnrl.train.update.sft import (
    TurnExample,
    _nll_backward,
    conversation_examples,
    supervised_warm_start,
)

torch.set_num_threads(1)


def _examples(policy: HFPolicy) -> list[TurnExample]:
    """Turns of four calculator demonstrations (with and without the tool): responses
    of different lengths, contexts that share the system prompt and earlier turns."""
    tasks = [make_task(12, "*", 34), make_task(5, "+", 6), make_task(81, "-", 7)]
    examples: list[TurnExample] = []
    for task, use_tool in zip([*tasks, tasks[0]], [True, False, True, False], strict=True):
        examples += conversation_examples(
            policy, demonstration("calculator", task, use_tool=use_tool)
        )
    return examples


def _gradients(policy: HFPolicy, batch: list[TurnExample], budget: int | None):
    policy.model.zero_grad(set_to_none=True)
    loss = _nll_backward(policy, batch, budget)
    grads = [p.grad.detach().clone() for p in policy.parameters() if p.grad is not None]
    return loss, grads


@pytest.mark.parametrize("budget", [40, 90, 100_000])
def test_tree_warm_start_has_the_loss_and_gradient_of_the_per_row_one(budget: int) -> None:
    policy = build_tiny_policy(seed=4, hidden=32, layers=2)
    batch = _examples(policy)
    forwards = split_rows([e.context for e in batch], [e.response for e in batch], budget)
    if budget < 100:
        assert len(forwards) >= 3  # the budget really cuts the batch
    rows_loss, rows_grads = _gradients(policy, batch, None)
    tree_loss, tree_grads = _gradients(policy, batch, budget)
    assert tree_loss == pytest.approx(rows_loss, rel=1e-5)
    assert len(tree_grads) == len(rows_grads)
    for tree, rows in zip(tree_grads, rows_grads, strict=True):
        assert torch.linalg.vector_norm(tree - rows) <= 1e-4 * torch.linalg.vector_norm(rows) + 1e-8


def test_warm_start_losses_do_not_depend_on_the_forward_budget() -> None:
    losses = {}
    for budget in (None, 40):
        policy = build_tiny_policy(seed=4, hidden=32, layers=2)
        examples = _examples(policy)
        losses[budget] = supervised_warm_start(
            policy, examples, steps=2, lr=1e-3, batch_size=6, seed=0, max_tokens_per_batch=budget
        )
    assert losses[40] == pytest.approx(losses[None], rel=1e-4)
