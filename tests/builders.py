"""Builders several test files share: turn records sampled from a policy, a finished
agent rollout, an optimiser that records gradients, a scripted policy on the tiny
tokenizer, a chat log.

``conftest.py`` holds the tiny training runs' settings and fixtures; this module holds
plain objects and functions a test imports (``from builders import ...``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.records import parse_record
from turnrl.types import Message, Sample, Task, TurnRecord

HAGGLE_LOG: dict[str, Any] = {
    "conversation_id": "c1",
    "messages": [
        {"role": "system", "content": "Sell a lamp."},
        {"role": "user", "content": "I'd pay 50."},
        {"role": "assistant", "content": "<offer>90</offer>"},
        {"role": "user", "content": "No. 60?"},
        {"role": "assistant", "content": "<accept/>"},
    ],
    "outcome": 0.25,
}
"""One chat log (``turnrl iterate --from-logs`` format): two assistant turns, an outcome."""


def one_turn_records(
    contexts: Sequence[Sequence[int]], samples: Sequence[Sample], tasks: Sequence[str]
) -> list[TurnRecord]:
    """One single-turn rollout ``r{i}`` per context, in task ``tasks[i]``, with the
    sampled response ids and behaviour log-probs."""
    return [
        parse_record(
            {
                "task_id": task,
                "traj_id": f"r{i}",
                "turn": 0,
                "prompt_ids": list(context),
                "response_ids": list(sample.response_ids),
                "logprobs": [float(x) for x in sample.logprobs],
            }
        )
        for i, (context, sample, task) in enumerate(zip(contexts, samples, tasks, strict=True))
    ]


def agent_rollout(name: str, versions: Sequence[int], temperatures: Sequence[float]) -> Any:
    """A finished agent rollout (``RolloutResult``) of task ``t`` whose turn ``k`` was
    sampled by policy version ``versions[k]`` at ``temperatures[k]``; reward 1 at the end."""
    from turnrl.train.agent.runner import RolloutResult  # the agent loop: heavy imports

    last = len(versions) - 1
    records = [
        parse_record(
            {
                "traj_id": name,
                "task_id": "t",
                "turn": turn,
                "prompt": "q",
                "response": "a",
                "reward": 1.0 if turn == last else 0.0,
                "done": turn == last,
                "policy_version": version,
                "temperature": temperature,
            }
        )
        for turn, (version, temperature) in enumerate(zip(versions, temperatures, strict=True))
    ]
    return RolloutResult(name, Task("t", {}), records=records, reward=1.0)


class GradientRecorder(torch.optim.Optimizer):
    """Records each step's gradients and leaves the parameters as they are."""

    def __init__(self, params) -> None:
        super().__init__(list(params), {})
        self.steps: list[list[torch.Tensor]] = []

    def step(self, closure=None) -> None:
        self.steps.append(
            [p.grad.detach().clone() for group in self.param_groups for p in group["params"]]
        )


@functools.cache
def tiny_tokenizer_policy() -> HFPolicy:
    """The tiny policy of seed 0, built once; scripted policies use only its tokenizer
    and chat template."""
    return build_tiny_policy(0)


class TokenizerPolicy:
    """The encoding half of the ``Policy`` protocol on the tiny tokenizer and chat
    template; a scripted policy subclasses it and writes ``sample``."""

    def __init__(self, max_context: int | None = None) -> None:
        self.inner = tiny_tokenizer_policy()
        self.eos_token_id = self.inner.eos_token_id
        self.max_context = max_context

    def encode_initial(self, messages: list[Message]) -> list[int]:
        return self.inner.encode_initial(messages)

    def encode_observation(self, message: Message) -> list[int]:
        return self.inner.encode_observation(message)

    def decode(self, ids: Sequence[int]) -> str:
        return self.inner.decode(ids)

    def tokens(self, text: str) -> list[int]:
        """``text``'s token ids, without special tokens."""
        return list(self.inner.tokenizer(text, add_special_tokens=False)["input_ids"])
