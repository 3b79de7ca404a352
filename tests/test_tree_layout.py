"""The update's tree layout: the trie numbering, the mask, budget splits, and log-probs and
gradients equal to per-row recomputation (tiny Qwen2, eager and sdpa attention, LoRA)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.policy.tree_layout import TreeLayout, split_rows, tree_logprobs
from turnrl.rollout.tokens import trie_size

torch.set_num_threads(1)

# Hand-built rows: a shared prompt [1, 2, 3]; two responses branching after their first
# token (4 then 5, or 4 then 6); a second turn whose context extends the first row; and
# an identical sample of the first row.
CONTEXTS = [[1, 2, 3], [1, 2, 3], [1, 2, 3, 4, 5, 7], [1, 2, 3]]
RESPONSES = [[4, 5], [4, 6], [8], [4, 5]]


def test_layout_numbers_the_trie_depth_first() -> None:
    layout = TreeLayout.build(CONTEXTS, RESPONSES)
    # Trie 1-2-3-4-{5-7-8, 6}, depth first in first-seen order.
    assert layout.ids == [1, 2, 3, 4, 5, 7, 8, 6]
    assert layout.depth == [0, 1, 2, 3, 4, 5, 6, 4]
    assert layout.parent == [-1, 0, 1, 2, 3, 4, 5, 3]
    assert layout.end == [8, 8, 8, 8, 7, 7, 7, 8]
    assert layout.nodes == [[3, 4], [3, 7], [6], [3, 4]]
    assert layout.last == [4, 7, 6, 4]
    assert (
        layout.size == trie_size([[*c, *r] for c, r in zip(CONTEXTS, RESPONSES, strict=True)]) == 8
    )


def test_ancestor_mask_is_ancestors_and_self() -> None:
    layout = TreeLayout.build(CONTEXTS, RESPONSES)
    mask = layout.ancestor_mask(torch.device("cpu"))
    expected = torch.zeros(8, 8, dtype=torch.bool)
    for i in range(8):
        j = i
        while j >= 0:
            expected[i, j] = True
            j = layout.parent[j]
    assert torch.equal(mask, expected)
    assert mask[7].tolist() == [True, True, True, True, False, False, False, True]


def test_split_rows_cuts_at_subtree_boundaries() -> None:
    contexts = [[1, 2, 3], [1, 2, 3], [1, 2, 9], [5, 6]]
    responses = [[4], [7], [8], [1]]
    # Whole trie: 1-2-{3-{4,7}, 9-8} (7 nodes) and 5-6-1 (3 nodes).
    assert split_rows(contexts, responses, 10) == [[0, 1, 2, 3]]
    # Budget 7: the 1-2 subtree fits, the 5-6-1 path starts a new group.
    assert split_rows(contexts, responses, 7) == [[0, 1, 2], [3]]
    # Budget 5: 1-2-3-4 + 7 (5 nodes), then 1-2-9-8 recomputes 1-2, then 5-6-1.
    assert split_rows(contexts, responses, 5) == [[0, 1], [2], [3]]
    # A row longer than the budget is a group of its own.
    assert split_rows(contexts, responses, 2) == [[0], [1], [2], [3]]
    with pytest.raises(ValueError, match="max_tokens"):
        split_rows(contexts, responses, 0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(1, 3), min_size=1, max_size=6),
            st.lists(st.integers(1, 3), min_size=0, max_size=4),
        ),
        min_size=1,
        max_size=8,
    ),
    st.integers(1, 12),
)
def test_split_rows_partitions_within_budget(rows, budget) -> None:
    contexts = [c for c, _ in rows]
    responses = [r for _, r in rows]
    groups = split_rows(contexts, responses, budget)
    assert sorted(b for g in groups for b in g) == list(range(len(rows)))
    sizes = [trie_size([[*contexts[b], *responses[b]] for b in g]) for g in groups]
    for group, size in zip(groups, sizes, strict=True):
        assert size <= budget or len(group) == 1
    whole = trie_size([[*c, *r] for c, r in rows])
    assert sum(sizes) >= whole
    if whole <= budget:
        assert len(groups) == 1


# --------------------------------------------------------------------------- model


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    return build_tiny_policy(seed=5)


def _rows(policy: HFPolicy) -> tuple[list[list[int]], list[list[int]]]:
    """Contexts and responses of a realistic small step: a shared system prompt, two
    questions, multi-turn contexts that extend earlier rows, identical samples, a branch
    in the middle of a response, and a PATR-style copy (same row twice)."""
    enc = policy.tokenizer
    system = {"role": "system", "content": "Answer with <answer>n</answer>."}

    def ids(text: str) -> list[int]:
        return enc(text, add_special_tokens=False)["input_ids"]

    eot = policy.eos_token_id
    q1 = policy.encode_initial([system, {"role": "user", "content": "2+3?"}])
    q2 = policy.encode_initial([system, {"role": "user", "content": "7*6?"}])
    call = [*ids("calc(2+3)"), eot]
    turn1 = [*q1, *call, *policy.encode_observation({"role": "tool", "content": "5"})]
    contexts = [q1, q1, q1, turn1, q2, q2, q1]
    responses = [
        call,
        [*ids("<answer>5</answer>"), eot],
        [*ids("<answer>6</answer>"), eot],  # branches from the previous row mid-response
        [*ids("<answer>5</answer>"), eot],
        [*ids("<answer>42</answer>"), eot],
        [*ids("<answer>42</answer>"), eot],  # identical sample
        call,  # a copy of row 0
    ]
    return contexts, responses


def _grads(policy: HFPolicy, loss_fn) -> list[torch.Tensor]:
    policy.model.zero_grad(set_to_none=True)
    loss_fn().backward()
    return [p.grad.clone() for p in policy.parameters()]


def _assert_close_grads(expected: list[torch.Tensor], got: list[torch.Tensor]) -> None:
    assert len(expected) == len(got) > 0
    for e, g in zip(expected, got, strict=True):
        assert torch.linalg.vector_norm(e - g) <= 1e-4 * torch.linalg.vector_norm(e) + 1e-9


def _check_equal_to_rows(policy: HFPolicy, temperature: float = 1.0) -> None:
    contexts, responses = _rows(policy)
    policy.model.train()
    expected, mask = policy.response_logprobs(contexts, responses, temperature=temperature)
    tree = policy.tree_logprobs(contexts, responses, temperature=temperature)
    assert torch.equal(tree.mask_B_T, mask)
    assert torch.allclose(tree.logp_B_T, expected, atol=1e-5, rtol=0)
    assert tree.tokens_computed == trie_size(
        [[*c, *r] for c, r in zip(contexts, responses, strict=True)]
    )
    assert (
        tree.tokens_computed
        < sum(len(c) + len(r) for c, r in zip(contexts, responses, strict=True)) / 2
    )
    weight = torch.rand(expected.shape, generator=torch.Generator().manual_seed(0))
    rows = _grads(
        policy,
        lambda: (
            policy.response_logprobs(contexts, responses, temperature=temperature)[0] * weight
        ).sum(),
    )
    trees = _grads(
        policy,
        lambda: (
            policy.tree_logprobs(contexts, responses, temperature=temperature).logp_B_T * weight
        ).sum(),
    )
    _assert_close_grads(rows, trees)
    policy.model.eval()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_tree_logprobs_and_gradients_equal_per_row_recomputation(policy, temperature) -> None:
    _check_equal_to_rows(policy, temperature)


def test_eager_attention_takes_the_additive_mask() -> None:
    policy = build_tiny_policy(seed=6)
    policy.model.set_attn_implementation("eager")
    assert policy.model.config._attn_implementation == "eager"
    _check_equal_to_rows(policy)


def test_unsupported_attention_is_a_clear_error() -> None:
    policy = build_tiny_policy(seed=6)
    policy.model.config._attn_implementation = "flash_attention_2"
    contexts, responses = _rows(policy)
    with pytest.raises(ValueError, match="sdpa or eager"):
        policy.tree_logprobs(contexts, responses)


def test_lora_adapters_get_the_same_gradients() -> None:
    pytest.importorskip("peft")
    from turnrl.policy.lora import lora_policy

    policy = lora_policy(build_tiny_policy(seed=7), rank=2, alpha=4.0)
    # Fresh adapters have B = 0, which would make every A gradient zero: perturb B.
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    _check_equal_to_rows(policy)


def test_budget_splits_give_the_same_gradients(policy) -> None:
    contexts, responses = _rows(policy)
    policy.model.train()
    weight = torch.rand((len(responses), max(map(len, responses))))
    whole = _grads(
        policy, lambda: (policy.tree_logprobs(contexts, responses).logp_B_T * weight).sum()
    )
    groups = split_rows(contexts, responses, 60)
    assert len(groups) > 2

    def split_loss() -> torch.Tensor:
        total = torch.zeros(())
        for group in groups:
            part = policy.tree_logprobs([contexts[b] for b in group], [responses[b] for b in group])
            width = part.logp_B_T.shape[1]
            total = total + (part.logp_B_T * weight[group, :width]).sum()
        return total

    _assert_close_grads(whole, _grads(policy, split_loss))
    policy.model.eval()


def test_empty_inputs_and_rows_without_response(policy) -> None:
    empty = tree_logprobs(policy.model, [], [], temperature=1.0)
    assert empty.logp_B_T.shape == (0, 0) and empty.tokens_computed == 0
    contexts, responses = _rows(policy)
    with torch.no_grad():
        got = policy.tree_logprobs([contexts[0], contexts[1]], [[], responses[1]])
        expected, _ = policy.response_logprobs([contexts[1]], [responses[1]])
    assert got.mask_B_T[0].sum() == 0 and got.logp_B_T[0].abs().sum() == 0
    assert torch.allclose(got.logp_B_T[1], expected[0], atol=1e-5)
    with pytest.raises(ValueError, match="pair up"):
        policy.tree_logprobs(contexts, responses[:1])
    with pytest.raises(ValueError, match="contexts\\[0\\] is empty"):
        policy.tree_logprobs([[]], [[1]])
