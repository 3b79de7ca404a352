"""Information gain: log-prob of the reference answer after a turn minus before it."""

from __future__ import annotations

import pytest
import torch

from turnrl.policy import build_tiny_policy
from turnrl.train.update.info_gain import add_information_gain, mean_answer_logprob
from turnrl.train.update.sft import encode_response
from turnrl.types import TurnRecord

torch.set_num_threads(1)


def test_information_gain_is_the_difference_of_answer_logprobs() -> None:
    policy = build_tiny_policy(0)
    start = policy.encode_initial([{"role": "user", "content": "Compute 12*34."}])
    call = encode_response(policy, "<call>12*34</call>")
    after = start + call + policy.encode_observation({"role": "tool", "content": "408"})
    records = [
        TurnRecord(task_id="t", traj_id="a", turn=0, prompt_ids=start),
        TurnRecord(task_id="t", traj_id="a", turn=1, prompt_ids=after),
        TurnRecord(task_id="t", traj_id="b", turn=0, prompt_ids=start),  # one turn: no IG
        TurnRecord(task_id="u", traj_id="c", turn=0, prompt_ids=start),  # no reference
        TurnRecord(task_id="u", traj_id="c", turn=1, prompt_ids=after),
    ]
    references = {"t": "<answer>408</answer>", "u": None}
    scored = add_information_gain(policy, records[::-1], references.get)[::-1]
    answer = encode_response(policy, references["t"])
    before_lp, after_lp = mean_answer_logprob(policy, [start, after], [answer, answer])
    assert scored[0].info_gain == pytest.approx(after_lp - before_lp, abs=1e-6)
    assert all(r.info_gain is None for r in scored[1:])
    assert scored[1:] == records[1:]  # the others come back as they were
    # direct computation of the mean log-prob for one context
    logp, mask = policy.response_logprobs([start], [answer])
    assert before_lp == pytest.approx(float(logp.sum() / mask.sum()), abs=1e-6)
