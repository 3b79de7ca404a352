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
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from turnrl.envs import demonstration, get_env_spec
from turnrl.policy import HFPolicy
from turnrl.policy.tree_layout import split_rows
from turnrl.types import Message, Task


@dataclass(frozen=True)
class TurnExample:
    """One assistant turn to imitate: its exact context ids and response ids."""

    context: list[int]
    response: list[int]


def encode_response(policy: HFPolicy, text: str) -> list[int]:
    """Ids of an assistant response as the policy would emit it (text + end-of-turn)."""
    ids = policy.tokenizer(text, add_special_tokens=False)["input_ids"]
    return [*ids, policy.eos_token_id]


def conversation_examples(policy: HFPolicy, messages: Sequence[Message]) -> list[TurnExample]:
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
    policy: HFPolicy,
    env_name: str,
    tasks: Sequence[Task],
    *,
    seed: int,
    tool_fraction: float,
    easy_tool_fraction: float,
    env_kwargs: dict | None = None,
) -> list[TurnExample]:
    """Per-turn examples from one demonstration per task, mixed as configured.

    The environment's ``demo_options`` (if it has one) draws each task's
    demonstration options from ``tool_fraction`` and ``easy_tool_fraction``.
    """
    rng = random.Random(seed)
    options = get_env_spec(env_name).demo_options
    examples: list[TurnExample] = []
    for task in tasks:
        kwargs = dict(env_kwargs or {})
        if options is not None:
            kwargs.update(options(task, rng, tool_fraction, easy_tool_fraction))
        examples += conversation_examples(policy, demonstration(env_name, task, **kwargs))
    return examples


def supervised_warm_start(
    policy: HFPolicy,
    examples: Sequence[TurnExample],
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    progress: object | None = None,
    max_tokens_per_batch: int | None = None,
) -> list[float]:
    """Train on ``examples`` with AdamW; returns the loss of each step.

    ``progress`` is an optional ``(rich Progress, task id)`` pair advanced per step.
    ``max_tokens_per_batch``: ``None`` recomputes every row on its own; a number uses
    the tree layout with forwards of at most that many positions (same loss).
    """
    if not examples:
        raise ValueError("no demonstration examples to train on")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    policy.model.train()
    losses = []
    for _ in range(steps):
        index = torch.randint(len(examples), (batch_size,), generator=generator).tolist()
        batch = [examples[i] for i in index]
        optimizer.zero_grad(set_to_none=True)
        loss = _nll_backward(policy, batch, max_tokens_per_batch)
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        losses.append(loss)
        if progress is not None:
            bar, task_id = progress  # type: ignore[misc]
            bar.update(task_id, advance=1, description=f"warm start  loss {losses[-1]:.3f}")
    policy.model.eval()
    return losses


def _nll_backward(
    policy: HFPolicy, batch: Sequence[TurnExample], max_tokens_per_batch: int | None
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
