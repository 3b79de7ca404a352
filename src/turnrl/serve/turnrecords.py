"""Record building: one call of an agent as a turn record (``docs/turn-records.md``).

Turn ``k`` of rollout ``r`` has ``traj_id=r``, ``turn=k``, ``role`` (the
request's ``model``), the messages the policy saw (``prompt``), ``prompt_ids``,
``response``, ``response_ids``, ``logprobs`` (under the sampling temperature,
recorded as ``temperature``), ``policy_version``, ``reward=0`` and
``done=false`` until the reward is posted on the last turn. Extra fields:
``finish_reason``, ``stop_reason``, ``tool_call``, ``context_rebuilt``, and ``forced``
(the text of a forced call's start, the last ids of ``prompt_ids``) when a call was
forced (``tool_choice`` ``"required"`` or a named function). Greedy
turns (``temperature=0``) are recorded with ``train: false`` and log-probs 0 (the
greedy choice has probability 1): no sampling distribution exists for a PPO
ratio, so trainers leave them out.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from turnrl.serve.batcher import Sampled
from turnrl.serve.responses import logprobs_content
from turnrl.serve.rollouts import Rollout
from turnrl.serve.toolcalls import Reply
from turnrl.serve.weights import ServedPolicy
from turnrl.types import Message, Sample, TurnRecord


def finish_reason(reply: Reply, sample: Sample) -> str:
    """OpenAI's ``finish_reason``: ``tool_calls``, ``length`` (cut at ``max_tokens``), ``stop``."""
    if reply.tool_calls:
        return "tool_calls"
    return "length" if sample.stop_reason == "length" else "stop"


def build_record(
    state: Rollout,
    role: str,
    turn: int,
    prompt: list[Message],
    prompt_ids: list[int],
    sampled: Sampled,
    temperature: float,
    *,
    finish: str,
    tool_call: bool,
    rebuilt: bool,
    forced: str = "",
) -> TurnRecord:
    """The turn record of one sampled call (reward 0 and not done until the reward);
    ``prompt_ids`` already end with the ids of ``forced``, if any."""
    sample = sampled.sample
    greedy = temperature == 0
    record = TurnRecord(
        task_id=state.task_id,
        traj_id=state.rollout_id,
        turn=turn,
        role=role,
        prompt=tuple(copy.deepcopy(prompt)),
        response=sample.text,
        prompt_ids=tuple(prompt_ids),
        response_ids=tuple(sample.response_ids),
        # Greedy: the choice had probability 1; there is no distribution to train on.
        logprobs=tuple(0.0 if greedy else float(x) for x in sample.logprobs),
        stop_reason=sample.stop_reason,
        temperature=float(temperature),
        policy_version=sampled.policy_version,
        train=not greedy,
    )
    return dataclasses.replace(
        record,
        finish_reason=finish,
        tool_call=tool_call,
        context_rebuilt=rebuilt,
        extra={"forced": forced} if forced else {},
    )


def response_logprobs(sampled: Sampled, served: ServedPolicy) -> dict[str, Any]:
    """OpenAI logprobs of the response, without a final end-of-turn token (for
    greedy turns, under the untempered distribution, as the policy reports them)."""
    sample = sampled.sample
    ids, logprobs = list(sample.response_ids), list(sample.logprobs)
    if sample.stop_reason == "stop" and ids:
        ids, logprobs = ids[:-1], logprobs[:-1]
    with served.lock:
        return logprobs_content(ids, logprobs, lambda i: served.policy.decode([i]))
