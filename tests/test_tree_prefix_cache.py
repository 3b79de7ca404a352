"""Prefix KV-cache reuse: same samples and log-probs as recomputation, exact token counts."""

from __future__ import annotations

import pytest
import torch

from turnrl.policy import build_tiny_policy
from turnrl.policy.prefix_cache import PrefixCache, Segment
from turnrl.rollout.tokens import PrefixReuse, trie_size

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def policy():
    return build_tiny_policy(seed=3)


def initial(policy, text: str) -> list[int]:
    return policy.encode_initial(
        [{"role": "system", "content": "S"}, {"role": "user", "content": text}]
    )


def extend(policy, contexts, samples, text: str) -> list[list[int]]:
    """Next-turn contexts, as the runner builds them."""
    observation = policy.encode_observation({"role": "user", "content": text})
    out = []
    for context, sample in zip(contexts, samples, strict=True):
        eos = [] if sample.stop_reason == "stop" else [policy.eos_token_id]
        out.append([*context, *sample.response_ids, *eos, *observation])
    return out


def assert_same(cached, plain, tol=1e-5):
    for a, b in zip(cached, plain, strict=True):
        assert a.response_ids == b.response_ids and a.stop_reason == b.stop_reason
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < tol


def assert_recomputed(policy, contexts, samples, tol=1e-5):
    """Recorded log-probs equal a fresh full forward on the exact context + response."""
    with torch.no_grad():
        logp, _ = policy.response_logprobs(contexts, [s.response_ids for s in samples])
    for i, s in enumerate(samples):
        recorded = torch.tensor(s.logprobs)
        assert torch.allclose(logp[i, : len(s.response_ids)], recorded, atol=tol, rtol=0)


def test_cached_sampling_matches_recomputation_over_several_turns(policy) -> None:
    a, b = initial(policy, "a long question, twice"), initial(policy, "short")
    contexts = [a, a, b, a]  # duplicates are encoded once
    cache = PrefixCache()
    for turn in range(3):
        cached = policy.sample(contexts, max_new_tokens=10, seed=turn, prefix_cache=cache)
        plain = policy.sample(contexts, max_new_tokens=10, seed=turn)
        assert_same(cached, plain)
        assert_recomputed(policy, contexts, cached)
        # branch: two rows continue from the same state, one from another
        contexts = extend(policy, contexts, cached, f"obs {turn}")
        contexts = [contexts[0], contexts[0], contexts[1], contexts[2]]
    assert cache.reused_tokens > 0


def test_tokens_computed_counts_exactly_what_was_run(policy) -> None:
    a, b = initial(policy, "abc"), initial(policy, "de")
    before = policy.tokens_computed
    plain = policy.sample([a, a, b], max_new_tokens=6, seed=1)
    decoded = sum(len(s.response_ids) - 1 for s in plain)
    assert policy.tokens_computed - before == 2 * len(a) + len(b) + decoded

    cache = PrefixCache()
    before = policy.tokens_computed
    first = policy.sample([a, a, b], max_new_tokens=6, seed=1, prefix_cache=cache)
    # a once; the two rows of a decode as one stream while their tokens agree
    decoded = shared_decode([a, a, b], first)
    assert policy.tokens_computed - before == len(a) + len(b) + decoded

    nxt = extend(policy, [a, a, b], first, "ok")
    before = policy.tokens_computed
    second = policy.sample(nxt, max_new_tokens=6, seed=2, prefix_cache=cache)
    # Cached: each context up to its response minus the last token (never fed back).
    new = 0
    seen = set()
    for context, old, sample in zip([a, a, b], first, nxt, strict=True):
        if tuple(sample) in seen:
            continue
        seen.add(tuple(sample))
        new += len(sample) - (len(context) + len(old.response_ids) - 1)
    assert policy.tokens_computed - before == new + shared_decode(nxt, second)


def shared_decode(contexts, samples) -> int:
    """Fed-back tokens when rows share a stream while context and tokens agree."""
    paths = [[tuple(c), *s.response_ids[:-1]] for c, s in zip(contexts, samples, strict=True)]
    return trie_size(paths) - len({tuple(c) for c in contexts})


def test_identical_greedy_rows_decode_once(policy) -> None:
    a = initial(policy, "same")
    before = policy.tokens_computed
    samples = policy.sample([a] * 4, max_new_tokens=8, temperature=0, prefix_cache=PrefixCache())
    assert len({tuple(s.response_ids) for s in samples}) == 1
    assert policy.tokens_computed - before == len(a) + len(samples[0].response_ids) - 1


def test_a_parameter_update_invalidates_the_cache(policy) -> None:
    local = build_tiny_policy(seed=4)
    context = [initial(local, "same context")]
    cache = PrefixCache()
    first = local.sample(context, max_new_tokens=8, seed=0, prefix_cache=cache)
    nxt = extend(local, context, first, "x")
    with torch.no_grad():
        next(local.model.parameters()).add_(0.05)  # an optimiser step, in place
    after = local.sample(nxt, max_new_tokens=8, seed=1, prefix_cache=cache)
    assert_recomputed(local, nxt, after)  # stale states would not match
    assert cache.reused_tokens == 0


def test_prefix_reuse_wrapper_counts_and_shares(policy) -> None:
    wrapped = PrefixReuse(policy)
    assert wrapped.cache is not None and wrapped.tokens_computed == 0
    a = initial(policy, "q")
    samples = wrapped.sample([a, a], max_new_tokens=5, seed=0)
    assert wrapped.tokens_computed == len(a) + sum(len(s.response_ids) - 1 for s in samples)
    wrapped.clear()
    assert wrapped.cache.stored_tokens == 0
    assert PrefixReuse(policy, enabled=False).cache is None


def test_prefix_cache_trie_and_segments() -> None:
    def kv(start: int, n: int):
        values = torch.arange(start, start + n, dtype=torch.float32).view(1, n, 1)
        return ((values, -values),)

    root = Segment(None, 0, kv(0, 3))  # positions 0..2 of [5, 6, 7]
    leaf = Segment(root, 2, kv(2, 2))  # positions 2..3 of [5, 6, 9, 9] (cut at 2)
    cache = PrefixCache()
    cache.store([5, 6, 7], root)
    cache.store([5, 6, 9, 9], leaf)
    assert cache.stored_tokens == 5  # 5, 6, 7 and 9, 9
    assert cache.lookup([5, 6, 9, 9, 1], limit=4) == (4, leaf)
    assert cache.lookup([5, 6, 7, 8], limit=2)[0] == 2
    assert cache.lookup([4], limit=1) == (0, None)
    assert cache.covers([5, 6]) and not cache.covers([5, 6, 8])
    ((keys, values),) = leaf.gather(4)
    assert keys.view(-1).tolist() == [0, 1, 2, 3] and values.view(-1).tolist() == [0, -1, -2, -3]
    with pytest.raises(ValueError, match="cannot gather 5"):
        leaf.gather(5)
    with pytest.raises(ValueError, match="3 ids but the segment chain ends at 4"):
        cache.store([1, 2, 3], leaf)
    cache.bind("v1")
    cache.bind("v2")
    assert cache.stored_tokens == 0 and cache.lookup([5], limit=1) == (0, None)
