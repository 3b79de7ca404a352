"""Information gain of each turn, for A2TGPO and IGPO.

IG of turn t = mean log-prob of the reference answer's tokens given the context
*after* turn t (the next turn's exact context) minus the same given the context
*before* it (this turn's context), under the current policy. The reference
answer is scored as if the policy answered right there: its ids (answer text +
end-of-turn token) are appended after the context's generation prompt.

The last turn of a trajectory has no "after" context and gets no IG (for a
calculator episode it is the answer turn, which A2TGPO credits through the
outcome advantage only). This follows A2TGPO's log-prob-difference mode; the
probability-difference mode of IGPO is not implemented.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable

import torch

from turnrl.policy import HFPolicy
from turnrl.train.update.sft import encode_response
from turnrl.types import TurnRecord


@torch.no_grad()
def mean_answer_logprob(
    policy: HFPolicy, contexts: list[list[int]], answers: list[list[int]], *, chunk: int = 64
) -> list[float]:
    """Mean log-prob per token of each answer after its context (batched)."""
    out: list[float] = []
    for start in range(0, len(contexts), chunk):
        logp_B_T, mask_B_T = policy.response_logprobs(
            contexts[start : start + chunk], answers[start : start + chunk]
        )
        out += ((logp_B_T * mask_B_T).sum(1) / mask_B_T.sum(1)).tolist()
    return out


def add_information_gain(
    policy: HFPolicy,
    records: list[TurnRecord],
    reference_of: Callable[[str], str | None],
) -> list[TurnRecord]:
    """``records`` (same order) with ``info_gain`` set on every turn that has a successor.

    ``reference_of(task_id)`` gives the reference answer text (``None``: skip the
    trajectory). Records need ``prompt_ids``. The other records come back as given.
    """
    by_traj: dict[str, list[int]] = defaultdict(list)
    for index, record in enumerate(records):
        by_traj[record.traj_id].append(index)
    contexts: list[list[int]] = []
    answers: list[list[int]] = []
    pairs: list[tuple[int, int, int]] = []
    for turns in by_traj.values():
        turns.sort(key=lambda i: records[i].turn)
        reference = reference_of(records[turns[0]].task_id)
        if reference is None or len(turns) < 2:
            continue
        answer = encode_response(policy, reference)
        first = len(contexts)
        for index in turns:
            contexts.append(list(records[index].prompt_ids or ()))
            answers.append(answer)
        pairs += [(index, first + i, first + i + 1) for i, index in enumerate(turns[:-1])]
    out = list(records)
    if not pairs:
        return out
    scores = mean_answer_logprob(policy, contexts, answers)
    for index, before, after in pairs:
        out[index] = dataclasses.replace(out[index], info_gain=scores[after] - scores[before])
    return out
