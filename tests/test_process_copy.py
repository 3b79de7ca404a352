"""``ProcessCopy``: the agent loop's served copy in a process of its own (K = 1, hf)."""

from __future__ import annotations

import os
import signal
import sys

import pytest
import torch

from turnrl.policy import factory
from turnrl.policy.sync import full_weights, push_weights
from turnrl.train.config import PolicyConfig
from turnrl.train.process_copy import ProcessCopy, ProcessCopyError

SETTINGS = PolicyConfig()
OPTIONS = {"max_new_tokens": 8, "temperature": 1.0, "seed": 5}


def contexts(policy: object) -> list[list[int]]:
    return [policy.encode_initial([{"role": "user", "content": f"{i}*{i}?"}]) for i in range(3)]


def assert_samples_of(policy: object, samples: list) -> None:
    """``samples`` are ``policy``'s own: its tokens for the same seed, its log-probs."""
    own = policy.sample(contexts(policy), **OPTIONS)
    assert [s.response_ids for s in samples] == [s.response_ids for s in own]
    for mine, theirs in zip(samples, own, strict=True):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)


@pytest.fixture
def copied():
    """A copy's process started from seed 3's model, then given seed 0's weights."""
    learner = factory.build_policy(SETTINGS, 0)
    served = ProcessCopy(learner, SETTINGS, seed=3)
    yield learner, served
    served.close()


def test_the_copy_samples_with_the_weights_pushed_to_it(copied) -> None:
    learner, served = copied
    with pytest.raises(ProcessCopyError, match="before any weights"):
        served.sample(contexts(learner), **OPTIONS)
    push_weights(learner, served, 0)  # full weights, as the agent loop pushes them
    assert served.policy_version == 0 and served.pid != os.getpid()
    assert_samples_of(learner, served.sample(contexts(learner), **OPTIONS))
    moved = factory.build_policy(SETTINGS, 0)
    with torch.no_grad():
        for parameter in moved.model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    served.load_full_weights(full_weights(moved), 1)
    assert served.policy_version == 1
    assert_samples_of(moved, served.sample(contexts(learner), **OPTIONS))


def test_a_lora_learner_is_served_merged() -> None:
    settings = PolicyConfig(lora_rank=2, lora_alpha=4.0)
    learner = factory.build_policy(settings, 0)
    with torch.no_grad():
        for name, parameter in learner.model.named_parameters():
            if "lora_B" in name:  # adapters that change the outputs
                parameter.add_(0.5 * torch.randn_like(parameter))
    served = ProcessCopy(learner, settings, seed=0)
    try:
        served.load_full_weights(full_weights(learner), 0)
        assert_samples_of(learner, served.sample(contexts(learner), **OPTIONS))
    finally:
        served.close()


def test_a_killed_copy_is_one_error_naming_it_and_close_leaves_nothing(copied) -> None:
    learner, served = copied
    served.load_full_weights(full_weights(learner), 0)
    os.kill(served.pid, signal.SIGKILL)
    with pytest.raises(ProcessCopyError) as caught:
        served.sample(contexts(learner), **OPTIONS)
    message = str(caught.value)
    assert f"(pid {served.pid}) ended with exit code -9 while sampling" in message
    assert "\n" not in message
    # kept for the trainer to stop the run with, and raised again by any later call
    assert served.failure is caught.value
    with pytest.raises(ProcessCopyError) as again:
        served.load_full_weights(full_weights(learner), 1)
    assert again.value is caught.value
    served.close()
    with pytest.raises(ProcessLookupError):
        os.kill(served.pid, 0)


def test_the_copy_quiets_the_resource_sharers_tracebacks(monkeypatch) -> None:
    """A child killed mid-handshake makes multiprocessing's resource sharer print
    tracebacks through ``sys.excepthook``; the copy installs the filter the sampler
    process uses (the death is said in the copy's one line instead). The hook is reset
    first: another test's sampler process may have installed it already."""
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    served = ProcessCopy(factory.build_policy(SETTINGS, 0), SETTINGS, seed=3)
    try:
        assert getattr(sys.excepthook, "quiet_peer_deaths", False)
    finally:
        served.close()


def test_a_failed_request_fails_that_call_only(copied) -> None:
    """A context the model cannot take is that call's error (as in the gateway's own
    thread before); the copy goes on serving the next call."""
    learner, served = copied
    served.load_full_weights(full_weights(learner), 0)
    too_long = [[5] * (learner.max_context + 1)]
    with pytest.raises(ProcessCopyError, match="the served copy failed while sampling: "):
        served.sample(too_long, **OPTIONS)
    assert_samples_of(learner, served.sample(contexts(learner), **OPTIONS))
