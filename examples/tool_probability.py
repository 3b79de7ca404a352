"""How likely a warm-started calculator policy is to open with a tool call, task by task.

For every training and held-out task of a run, the probability that the policy's
first response is a call: P(``<call>``) / (P(``<call>``) + P(``<answer>``)) for the
first reply, computed exactly from the model's log-probabilities (no sampling).
Greedy decoding calls the tool where this is above 0.5. A warm start that imitated
a 40% tool mix faithfully sits near 0.4 on every task; one that memorised which
training tasks got the tool spreads out.

    python examples/tool_probability.py runs/calculator [runs/other ...]

(each argument: a run directory with ``config.toml`` and ``warm_start/``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from turnrl.envs import make_env
from turnrl.policy import HFPolicy
from turnrl.train.config import RunConfig, load_config
from turnrl.train.run import task_split
from turnrl.types import Task


def tool_probabilities(policy: HFPolicy, config: RunConfig, tasks: list[Task]) -> np.ndarray:
    """P(first reply is a call) for each task, from the two replies' log-probabilities
    (the call on the task's own expression, the answer with its right number)."""
    env = make_env(config.env.name, **config.env.env_kwargs)
    contexts = [policy.encode_initial(env.reset(task)) for task in tasks]
    calls = [_ids(policy, "<call>")] * len(tasks)
    answers = [_ids(policy, "<answer>")] * len(tasks)
    with torch.no_grad():
        call_logp, call_mask = policy.response_logprobs(contexts, calls)
        answer_logp, answer_mask = policy.response_logprobs(contexts, answers)
    call = (call_logp * call_mask).sum(-1)
    answer = (answer_logp * answer_mask).sum(-1)
    return torch.sigmoid(call - answer).numpy()


def _ids(policy: HFPolicy, text: str) -> list[int]:
    return policy.tokenizer(text, add_special_tokens=False)["input_ids"]


def main(run_dirs: list[str]) -> None:
    for run_dir in run_dirs:
        path = Path(run_dir)
        config = load_config(RunConfig, path / "config.toml", saved_copy=True)
        policy = HFPolicy.from_pretrained(path / "warm_start")
        policy.model.eval()
        split = task_split(config.env)
        print(
            f"{run_dir} (mix = {config.warm_start.mix!r}, "
            f"tool_fraction = {config.warm_start.tool_fraction})"
        )
        for name, tasks in (("train", split.train[:256]), ("held-out", split.eval)):
            p = tool_probabilities(policy, config, tasks)
            print(
                f"  {name:9s} n={len(p):3d}  mean {p.mean():.3f}  sd {p.std():.3f}  "
                f"min {p.min():.3f}  max {p.max():.3f}  share > 0.5: {(p > 0.5).mean():.3f}"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
