"""One vLLM server behind torchrun ranks (``policy.backend = "vllm-server"``, K = 0).

Every rank samples its share of a step on the one server, which holds one set of
weights: rank 0 alone hands it each version, and the other ranks sample only after that
(:meth:`turnrl.train.online.ranks.DistributedOnlineTrainer._push_weights`). Real 2-rank
gloo launches of the CLI (tests/test_distributed.py's helpers) against the stand-in
server of ``fake_vllm`` (real HTTP, vLLM's routes, a transformers copy that records the
version behind each completion and every push), which answers an unload of an adapter
it does not hold with 404, as vLLM does.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fake_vllm import TransformersVLLMServer
from test_distributed import RECIPE, RUN, train, weights
from turnrl.config_toml import load_config
from turnrl.policy.factory import build_policy
from turnrl.policy.sync import full_weights
from turnrl.train.config import RunConfig

LORA = ("policy.lora_rank=4", "policy.lora_alpha=8.0", "train.lr=3e-3")


def turns(run: Path, step: int) -> int:
    """How many turns step ``step`` sampled (one completion each), from its rollout log."""
    return len((run / "rollouts" / f"step-{step:06d}.jsonl").read_text().splitlines())


@pytest.mark.parametrize("lora", [False, True], ids=["full-weights", "lora"])
def test_two_ranks_share_one_server_that_rank_zero_alone_updates(
    tmp_path: Path, lora: bool
) -> None:
    """3 steps on 2 ranks: the server got each version once, in order (for LoRA the
    base once, then adapters; both ranks pushed each before), every step's completions
    came from the version before it (so no rank sampled before the push of its step),
    and the server ends on the learner's final weights."""
    extra = LORA if lora else ()
    settings = load_config(RunConfig, RECIPE, [*RUN, *extra]).policy
    # the server holds the base model, from other weights than the learner's start
    server = TransformersVLLMServer(build_policy(replace(settings, lora_rank=0), 7))
    run = tmp_path / "run"
    try:
        train(
            run, 2, *extra, "policy.backend=vllm-server", f"policy.server_url={server.url}",
            "train.log_rollouts_every=1", "train.eval_every=3",
        )  # fmt: skip
    finally:
        server.close()
    if lora:
        assert server.loads == [("full", 0)] + [("lora", v) for v in range(4)]
    else:
        assert server.loads == [("full", v) for v in range(4)]
    # step n samples with version n - 1 (rank 0 also evaluates with versions 0 and 3):
    # a rank sampling before the push of its step would show as a version out of order
    # or a count off by its turns
    held = Counter(server.held)
    assert server.held == sorted(server.held) and set(held) == {0, 1, 2, 3}
    assert held[0] > turns(run, 1) and (held[1], held[2]) == (turns(run, 2), turns(run, 3))
    learner = build_policy(settings, 0)
    # the learner after step 3 (with LoRA the checkpoint holds the adapters; the base
    # is the start's, seed 0 with no warm start)
    learner.load_state_dict(weights(run, 3))
    served, _ = server.models[server.served_name()]
    final = full_weights(learner)
    for name, tensor in served.state_dict().items():
        torch.testing.assert_close(tensor, final[name], atol=1e-6, rtol=0)
