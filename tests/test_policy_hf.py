"""HFPolicy on the tiny model: token exactness, batched KV-cached sampling, log-probs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from turnrl.policy import HFPolicy, build_tiny_model, build_tiny_policy, build_tiny_tokenizer
from turnrl.policy.tiny import ALPHABET
from turnrl.types import Policy

torch.set_num_threads(1)

EOT_BIAS = 2.5
"""Added to the end-of-turn logit so that random tiny models stop after ~10 tokens."""


def _bias_end_of_turn(policy: HFPolicy, bias: float = EOT_BIAS) -> HFPolicy:
    """Make the end-of-turn token likelier by a hook on the output layer (tests only)."""
    offset = torch.zeros(len(policy.tokenizer))
    offset[policy.eos_token_id] = bias
    policy.model.lm_head.register_forward_hook(lambda _m, _i, logits: logits + offset)
    return policy


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    return build_tiny_policy(seed=0)


@pytest.fixture(scope="module")
def chatty() -> HFPolicy:
    return _bias_end_of_turn(build_tiny_policy(seed=1))


def _contexts(policy: HFPolicy) -> list[list[int]]:
    """Contexts of different lengths (exercises padding and position ids)."""
    return [
        policy.encode_initial([{"role": "user", "content": "hi"}]),
        policy.encode_initial(
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "x" * 23}]
        ),
        policy.encode_initial([{"role": "user", "content": "what is 6*7?"}]),
    ]


def test_satisfies_the_policy_protocol(policy) -> None:
    assert isinstance(policy, Policy)
    assert policy.eos_token_id == policy.tokenizer.eos_token_id == 3
    assert policy.pad_token_id == 0
    assert policy.max_context == 4096


def test_encode_observation_is_the_template_delta(policy) -> None:
    assert policy.observation_text({"role": "tool", "content": "42"}) == (
        "\n<|im_start|>t:42<|im_end|>\n<|im_start|>a:"
    )
    assert policy.decode(policy.encode_observation({"role": "user", "content": "ok"})) == (
        "\n<|im_start|>u:ok<|im_end|>\n<|im_start|>a:"
    )


def _append_turns(policy: HFPolicy, first: list, turns: list) -> tuple[list[int], list]:
    """Grow a context by appending ids; return it and the equivalent message list."""
    ids = policy.encode_initial(first)
    messages = list(first)
    for answer, observation in turns:
        ids += policy.tokenizer(answer, add_special_tokens=False)["input_ids"]
        ids.append(policy.eos_token_id)
        ids += policy.encode_observation(observation)
        messages += [{"role": "assistant", "content": answer}, observation]
    return ids, messages


def test_token_exactness_across_turns_with_a_tool_message(policy) -> None:
    first = [{"role": "system", "content": "use tools"}, {"role": "user", "content": "2+3*4?"}]
    turns = [
        ('<tool>{"expr": "3*4"}</tool>', {"role": "tool", "content": "12"}),
        ("<tool>2+12</tool>", {"role": "tool", "content": "14"}),
        ("14", {"role": "user", "content": "sure?\nyes"}),
    ]
    appended, messages = _append_turns(policy, first, turns)
    rendered = policy.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    rerendered = policy.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert appended == rerendered


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(alphabet=ALPHABET, max_size=12),
            st.sampled_from(["user", "tool", "system"]),
            st.text(alphabet=ALPHABET, max_size=12),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_token_exactness_property(policy, turns) -> None:
    first = [{"role": "user", "content": "q"}]
    pairs = [(answer, {"role": role, "content": obs}) for answer, role, obs in turns]
    appended, messages = _append_turns(policy, first, pairs)
    rendered = policy.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert appended == policy.tokenizer(rendered, add_special_tokens=False)["input_ids"]


def test_bad_messages_get_clear_errors(policy) -> None:
    with pytest.raises(ValueError, match="empty"):
        policy.encode_initial([])
    with pytest.raises(ValueError, match=r"messages\[1\]: field 'content'"):
        policy.encode_initial([{"role": "user", "content": "a"}, {"role": "user"}])
    with pytest.raises(TypeError, match=r"observation\[0\]"):
        policy.encode_observation("hello")  # type: ignore[arg-type]


def _check_sample_invariants(policy: HFPolicy, samples, max_new_tokens: int) -> None:
    for s in samples:
        assert len(s.logprobs) == len(s.response_ids) >= 1
        assert all(lp <= 0.0 for lp in s.logprobs)
        stops = [i for i, t in enumerate(s.response_ids) if t in policy.stop_token_ids]
        if s.stop_reason == "stop":
            assert stops == [len(s.response_ids) - 1]
            assert len(s.response_ids) <= max_new_tokens
        else:
            assert s.stop_reason == "length"
            assert stops == []
            assert len(s.response_ids) == max_new_tokens
        assert s.text == policy.decode(s.response_ids)
        assert "<|im_end|>" not in s.text


def test_sampling_stops_at_end_of_turn_or_length(chatty) -> None:
    contexts = _contexts(chatty) * 4
    samples = chatty.sample(contexts, max_new_tokens=12, temperature=1.0, seed=0)
    _check_sample_invariants(chatty, samples, 12)
    assert {s.stop_reason for s in samples} == {"stop", "length"}


def test_truncated_responses_have_no_end_token(policy) -> None:
    samples = policy.sample(_contexts(policy), max_new_tokens=3, temperature=0.0)
    _check_sample_invariants(policy, samples, 3)
    assert [s.stop_reason for s in samples] == ["length"] * 3


def test_batched_greedy_equals_per_context_greedy() -> None:
    # A weaker end-of-turn bias: greedy rows now either stop at once or run to the limit,
    # so finished rows keep stepping next to unfinished ones.
    policy = _bias_end_of_turn(build_tiny_policy(seed=1), bias=0.5)
    contexts = [
        *_contexts(policy),
        *(policy.encode_initial([{"role": "user", "content": "a" * k}]) for k in (3, 9, 17)),
    ]
    batched = policy.sample(contexts, max_new_tokens=15, temperature=0.0)
    assert {s.stop_reason for s in batched} == {"stop", "length"}
    for context, together in zip(contexts, batched, strict=True):
        (alone,) = policy.sample([context], max_new_tokens=15, temperature=0.0)
        assert alone.response_ids == together.response_ids
        assert alone.stop_reason == together.stop_reason
        assert alone.logprobs == pytest.approx(together.logprobs, abs=1e-5)
    _check_sample_invariants(policy, batched, 15)


def test_same_seed_same_samples(chatty) -> None:
    contexts = _contexts(chatty)
    first = chatty.sample(contexts, max_new_tokens=10, temperature=1.0, seed=7)
    again = chatty.sample(contexts, max_new_tokens=10, temperature=1.0, seed=7)
    other = chatty.sample(contexts, max_new_tokens=10, temperature=1.0, seed=8)
    assert first == again
    assert [s.response_ids for s in first] != [s.response_ids for s in other]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_match_response_logprobs(chatty, temperature: float) -> None:
    contexts = _contexts(chatty)
    samples = chatty.sample(contexts, max_new_tokens=12, temperature=temperature, seed=3)
    responses = [s.response_ids for s in samples]
    logp_B_T, mask_B_T = chatty.response_logprobs(contexts, responses, temperature=temperature)
    assert logp_B_T.shape == mask_B_T.shape == (3, max(len(r) for r in responses))
    for i, s in enumerate(samples):
        n = len(s.response_ids)
        assert mask_B_T[i].tolist() == [1.0] * n + [0.0] * (mask_B_T.shape[1] - n)
        assert logp_B_T[i, :n].tolist() == pytest.approx(s.logprobs, abs=1e-5)
        assert logp_B_T[i, n:].abs().sum().item() == 0.0


def test_response_logprobs_are_differentiable(policy) -> None:
    contexts = _contexts(policy)
    responses = [[10, 11, 3], [12], []]
    logp_B_T, mask_B_T = policy.response_logprobs(contexts, responses)
    assert logp_B_T.requires_grad
    (-(logp_B_T * mask_B_T).sum()).backward()
    grads = [p.grad for p in policy.parameters()]
    assert all(g is not None for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    policy.model.zero_grad(set_to_none=True)


def test_response_logprobs_input_errors(policy) -> None:
    with pytest.raises(ValueError, match="pair up"):
        policy.response_logprobs([[1, 2]], [])
    with pytest.raises(ValueError, match=r"contexts\[0\] is empty"):
        policy.response_logprobs([[]], [[5]])
    with pytest.raises(ValueError, match="temperature"):
        policy.response_logprobs([[5]], [[5]], temperature=0.0)


def test_max_context_guard_and_length_stop() -> None:
    tokenizer = build_tiny_tokenizer()
    small = HFPolicy(build_tiny_model(tokenizer, seed=0, max_positions=32), tokenizer)
    with pytest.raises(ValueError, match=r"contexts\[1\]: 32 context tokens \+ 1 more exceed"):
        small.sample([[5] * 10, [5] * 32], max_new_tokens=4)
    with pytest.raises(ValueError, match="max positions"):
        small.response_logprobs([[5] * 30], [[6] * 3])
    (s,) = small.sample([[5] * 30], max_new_tokens=10, temperature=0.0)
    assert s.stop_reason == "length"
    assert len(s.response_ids) == 2


def test_clone_frozen_is_an_independent_copy(policy) -> None:
    frozen = policy.clone_frozen()
    assert not any(p.requires_grad for p in frozen.model.parameters())
    ids = torch.tensor([_contexts(policy)[0]])
    with torch.no_grad():
        assert torch.equal(policy.model(input_ids=ids).logits, frozen.model(input_ids=ids).logits)
        next(frozen.model.parameters()).add_(1.0)
        assert not torch.equal(
            policy.model(input_ids=ids).logits, frozen.model(input_ids=ids).logits
        )


def test_save_and_state_dict_round_trips(tmp_path) -> None:
    policy = build_tiny_policy(seed=5)
    policy.save(tmp_path)
    loaded = HFPolicy.from_pretrained(tmp_path)
    other = build_tiny_policy(seed=6)
    other.load_state_dict(policy.state_dict())
    ids = torch.tensor([_contexts(policy)[1]])
    with torch.no_grad():
        expected = policy.model(input_ids=ids).logits
        assert torch.equal(loaded.model(input_ids=ids).logits, expected)
        assert torch.equal(other.model(input_ids=ids).logits, expected)
    assert loaded.encode_observation({"role": "tool", "content": "1"}) == policy.encode_observation(
        {"role": "tool", "content": "1"}
    )


def test_decode_drops_the_end_of_turn_token(policy) -> None:
    ids = policy.tokenizer("ok", add_special_tokens=False)["input_ids"]
    assert policy.decode([*ids, policy.eos_token_id]) == "ok"
    assert policy.decode(ids) == "ok"
