"""vLLM loads ``turnrl export``'s directory as it is (docs/export.md).

Runs in ``.venv-vllm`` (``make test-vllm``); skipped wherever ``import vllm`` fails. A
run directory is built by hand (the tiny model with ``policy.heads = 2``, head size 32,
which vLLM's CPU attention accepts; a checkpoint whose weights differ from the warm
start), exported with ``turnrl export``, and given to a plain ``vllm.LLM`` with its own
tokenizer and chat template (no turnrl in between). The engine's log-probs of the
tokens it samples must match ``transformers``' forward on the same export within
``LOGP_TOL`` = 1e-4 per token (float32 on the CPU; measured here: 4.8e-7 over 60 tokens).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vllm is not installed here (make setup-vllm)")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from turnrl.cli import main  # noqa: E402
from turnrl.policy import factory  # noqa: E402
from turnrl.train.checkpoint import save_checkpoint  # noqa: E402

LOGP_TOL = 1e-4
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # a shared machine: no pinning
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process

MESSAGES = [[{"role": "user", "content": f"What is {i}*{i}?"}] for i in range(4)] + [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2"}]
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``turnrl export`` of a hand-built run whose checkpoint moved every weight."""
    root = tmp_path_factory.mktemp("vllm-export")
    run = root / "run"
    policy = factory.build_tiny_policy(0, heads=2, kv_heads=1)
    policy.save(run / "warm_start")
    (run / "config.toml").write_text('[policy]\ndtype = "float32"\nheads = 2\n')
    generator = torch.Generator().manual_seed(7)
    state = {
        name: value + 0.05 * torch.randn(value.shape, generator=generator)
        for name, value in policy.state_dict().items()
    }
    save_checkpoint(run, 5, state, None)
    out = root / "export"
    assert main(["export", str(run), "-o", str(out)]) == 0
    return out


def transformers_logprobs(model: Any, prompt: list[int], response: list[int]) -> list[float]:
    sequence = torch.tensor([[*prompt, *response]])
    with torch.no_grad():
        logits = model(sequence).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1).gather(1, sequence[0, 1:, None])[:, 0]
    return [float(x) for x in logp[len(prompt) - 1 :]]


def test_vllm_serves_the_export_with_transformers_log_probs(exported: Path) -> None:
    llm = vllm.LLM(
        model=str(exported),
        dtype="float32",
        seed=0,
        max_model_len=512,
        kv_cache_memory_bytes=2**30,
        enable_prefix_caching=False,
        enforce_eager=True,  # a faster start; the graph vLLM runs is the same model
    )
    try:
        params = vllm.SamplingParams(temperature=1.0, max_tokens=12, logprobs=0, seed=3)
        outputs = llm.chat(MESSAGES, params, use_tqdm=False)
    finally:
        engine = getattr(llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if shutdown is not None:
            shutdown()
    tokenizer = AutoTokenizer.from_pretrained(str(exported))
    run_layout = factory.build_tiny_policy(0, heads=2, kv_heads=1)  # the run's tokenizer
    model = AutoModelForCausalLM.from_pretrained(str(exported), dtype=torch.float32).eval()
    gaps = []
    for messages, output in zip(MESSAGES, outputs, strict=True):
        # vLLM rendered the export's own chat template with the export's tokenizer
        expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        if not isinstance(expected, list):
            expected = expected["input_ids"]
        assert (
            list(output.prompt_token_ids) == list(expected) == run_layout.encode_initial(messages)
        )
        completion = output.outputs[0]
        ids = list(completion.token_ids)
        assert len(ids) >= 1 and len(completion.logprobs) == len(ids)
        engine_logps = [step[t].logprob for step, t in zip(completion.logprobs, ids, strict=True)]
        reference = transformers_logprobs(model, list(output.prompt_token_ids), ids)
        gaps += [abs(a - b) for a, b in zip(engine_logps, reference, strict=True)]
    print(f"max |vLLM - transformers| log-prob over {len(gaps)} tokens: {max(gaps):.2e}")
    assert max(gaps) < LOGP_TOL
