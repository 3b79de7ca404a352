"""Supervised warm start on generated demonstrations.

Demonstrations are full conversations of ideal solutions produced by the
environment itself (``turnrl.envs.demonstration``). They are tokenised exactly the
way rollouts build contexts (``encode_initial`` once, then response ids + the
end-of-turn token, then ``encode_observation`` for each tool/user message), so
the warm start trains on the same token layout that RL will sample from. Each
assistant turn is one (context, response) row; the loss is the mean negative
log-likelihood per response token. With ``max_tokens_per_batch`` set (what the
trainers pass when their update is ``"tree"``), each batch's distinct token
prefixes are computed once (:mod:`turnrl.policy.tree_layout`: demonstrations
share their system prompt, a conversation's later turns contain its earlier
ones), in forwards of at most that many positions; the loss and its gradient
are the same.

The mix is configurable: on the calculator, ``tool_fraction`` of the
demonstrations of hard (and medium) tasks call the tool (the rest answer
directly, with the correct number), and ``easy_tool_fraction`` of easy-task
demonstrations do; on ``lookup``, ``tool_fraction`` of demonstrations search
every hop (the rest stop early or skip a hop). A warm start that is right only
sometimes leaves RL something to learn: *when* to call the tool, when to stop
searching.

How the mix is drawn (``mix``): ``"per_task"`` draws one demonstration per task,
so each task is seen with the tool or without it, always the same way, and only
the tasks drawn to use the tool teach how to write a call and copy its result.
``"per_draw"`` keeps every variant of every task and samples turns in
proportion to the variant's probability: each task's first reply is the mixture
itself (a model could not learn *which* tasks got the tool, because none did
more than another), and every task teaches the tool path. On the calculator demo
the tiny model did not memorise per-task choices either way: the probability of
opening with a call was 0.39-0.41 on every task after a ``per_task`` warm start
and 0.41-0.43 after ``per_draw`` (``examples/tool_probability.py``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from turnrl.envs import demonstration, get_env_spec
from turnrl.policy.trainable import TrainablePolicy
from turnrl.policy.tree_layout import split_rows
from turnrl.train.update.divergence import check_finite_parameters, check_finite_step
from turnrl.types import Message, Task


@dataclass(frozen=True)
class TurnExample:
    """One assistant turn to imitate: its exact context ids and response ids."""

    context: list[int]
    response: list[int]
    weight: float = 1.0
    """Relative probability of drawing this turn into an SFT batch."""


def encode_response(policy: TrainablePolicy, text: str) -> list[int]:
    """Ids of an assistant response as the policy would emit it (text + end-of-turn)."""
    ids = policy.tokenizer(text, add_special_tokens=False)["input_ids"]
    return [*ids, policy.eos_token_id]


def conversation_examples(
    policy: TrainablePolicy, messages: Sequence[Message]
) -> list[TurnExample]:
    """Split one conversation into per-turn examples with incrementally built contexts."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    context = policy.encode_initial(list(messages[:first]))
    examples = []
    for message in messages[first:]:
        if message["role"] == "assistant":
            response = encode_response(policy, message["content"])
            examples.append(TurnExample(list(context), response))
            context = context + response
        else:
            context = context + policy.encode_observation(message)
    return examples


def demonstration_examples(
    policy: TrainablePolicy,
    env_name: str,
    tasks: Sequence[Task],
    *,
    seed: int,
    tool_fraction: float,
    easy_tool_fraction: float,
    env_kwargs: dict | None = None,
    mix: str = "per_task",
) -> list[TurnExample]:
    """Per-turn examples of ``tasks``' demonstrations, mixed as configured.

    ``mix = "per_task"``: the environment's ``demo_options`` (if it has one) draws
    each task's one demonstration from ``tool_fraction`` and ``easy_tool_fraction``.
    ``mix = "per_draw"``: every variant its ``demo_variants`` lists, each turn
    weighted by the variant's probability (see the module docstring); an
    environment without ``demo_options`` has one variant, the ideal demonstration.
    """
    spec = get_env_spec(env_name)
    if mix == "per_draw" and spec.demo_options is not None:
        if spec.demo_variants is None:
            raise ValueError(f"environment {env_name!r} has no demo_variants for mix='per_draw'")
        variants = spec.demo_variants
        return [
            replace(example, weight=probability)
            for task in tasks
            for probability, options in variants(task, tool_fraction, easy_tool_fraction)
            for example in conversation_examples(
                policy, demonstration(env_name, task, **{**(env_kwargs or {}), **options})
            )
        ]
    if mix not in ("per_task", "per_draw"):
        raise ValueError(f"mix must be 'per_task' or 'per_draw'; got {mix!r}")
    rng = random.Random(seed)
    examples: list[TurnExample] = []
    for task in tasks:
        kwargs = dict(env_kwargs or {})
        if spec.demo_options is not None:
            kwargs.update(spec.demo_options(task, rng, tool_fraction, easy_tool_fraction))
        examples += conversation_examples(policy, demonstration(env_name, task, **kwargs))
    return examples


def supervised_warm_start(
    policy: TrainablePolicy,
    examples: Sequence[TurnExample],
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    progress: object | None = None,
    max_tokens_per_batch: int | None = None,
    lr_schedule: str = "constant",
) -> list[float]:
    """Train on ``examples`` with AdamW; returns the loss of each step.

    Each step draws ``batch_size`` turns with replacement, in proportion to their
    ``weight`` (uniformly when all weights are equal).

    ``progress`` is an optional ``(rich Progress, task id)`` pair advanced per step.
    ``max_tokens_per_batch``: ``None`` recomputes every row on its own; a number uses
    the tree layout with forwards of at most that many positions (same loss).
    ``lr_schedule``: ``"constant"`` or ``"cosine"`` (step ``i`` of ``steps`` at
    ``lr * (1 + cos(pi * i / steps)) / 2``).

    A step whose loss or gradient norm is not finite, or weights left non-finite,
    raise :class:`~turnrl.train.update.divergence.DivergedUpdateError` (nothing of a
    diverged warm start is saved).
    """
    if not examples:
        raise ValueError("no demonstration examples to train on")
    generator = torch.Generator().manual_seed(seed)
    weights = torch.tensor([e.weight for e in examples], dtype=torch.float64)  # once
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    policy.model.train()
    losses = []
    for step in range(steps):
        batch = [examples[i] for i in batch_indices(weights, batch_size, generator)]
        for group in optimizer.param_groups:
            group["lr"] = lr * lr_factor(lr_schedule, step, steps)
        optimizer.zero_grad(set_to_none=True)
        loss = _nll_backward(policy, batch, max_tokens_per_batch)
        norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0))
        check_finite_step(loss, norm, f"warm start step {step + 1}")
        optimizer.step()
        losses.append(loss)
        if progress is not None:
            bar, task_id = progress  # type: ignore[misc]
            bar.update(task_id, advance=1, description=f"warm start  loss {losses[-1]:.3f}")
    policy.model.eval()
    check_finite_parameters(list(policy.parameters()), f"the warm start's {steps} steps")
    return losses


def batch_indices(
    weights: Sequence[float] | torch.Tensor, size: int, generator: torch.Generator
) -> list[int]:
    """``size`` indices drawn with replacement in proportion to ``weights``; equal weights
    draw uniformly with ``torch.randint`` (the stream warm starts used before weights)."""
    probabilities = torch.as_tensor(weights, dtype=torch.float64)
    if bool((probabilities == probabilities[0]).all()):
        return torch.randint(len(probabilities), (size,), generator=generator).tolist()
    return torch.multinomial(probabilities, size, replacement=True, generator=generator).tolist()


def lr_factor(schedule: str, step: int, steps: int) -> float:
    """The learning-rate factor of 0-based ``step`` of ``steps`` under ``schedule``:
    ``"constant"`` 1, ``"cosine"`` ``(1 + cos(pi * step / steps)) / 2``."""
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * step / steps))
    raise ValueError(f"lr_schedule must be 'constant' or 'cosine'; got {schedule!r}")


def _nll_backward(
    policy: TrainablePolicy, batch: Sequence[TurnExample], max_tokens_per_batch: int | None
) -> float:
    """Backpropagate the mean negative log-likelihood per response token of ``batch``
    (in forwards of at most ``max_tokens_per_batch`` distinct positions, or one per-row
    forward when ``None``); return it."""
    contexts = [e.context for e in batch]
    responses = [e.response for e in batch]
    total_tokens = sum(len(r) for r in responses)
    if max_tokens_per_batch is None:
        logp_B_T, mask_B_T = policy.response_logprobs(contexts, responses)
        loss = -(logp_B_T * mask_B_T).sum() / total_tokens
        loss.backward()
        return float(loss.item())
    value = 0.0
    for group in split_rows(contexts, responses, max_tokens_per_batch):
        part = policy.tree_logprobs([contexts[i] for i in group], [responses[i] for i in group])
        loss = -(part.logp_B_T * part.mask_B_T).sum() / total_tokens
        loss.backward()
        value += float(loss.item())
    return value
