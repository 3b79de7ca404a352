"""``n`` > 1 through the gateway (``turnrl.serve.choices``): several choices of one call.

The tiny model samples the choices (seeded, so every token is known); the official
``openai`` client makes the calls. What is checked: each seeded choice is exactly the
single call with its derived seed; ``usage`` counts the prompt once and every choice's
tokens; the record holds the choice the agent continued (trained) with the others as
siblings (never trained), or choice 0 not trained when no later call says which; the
stream carries every choice; ``n`` is bounded.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import openai
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from serve_scripted import ScriptedPolicy, rollout_client, rollout_records, serving
from turnrl.credit.registry import compute_credit
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.records import parse_record, record_to_json
from turnrl.serve import Gateway, GatewayServer
from turnrl.serve.batcher import MicroBatcher
from turnrl.serve.choices import choice_seeds
from turnrl.serve.errors import GatewayError
from turnrl.serve.protocol import MAX_CHOICES, parse_chat_request
from turnrl.table import TurnTable
from turnrl.train.update.ppo import build_update_batch, trainable_rows

torch.set_num_threads(1)

QUESTION = [{"role": "user", "content": "What is 40+2?"}]
SEED = 11
REQUEST: dict[str, Any] = {"model": "m", "messages": QUESTION, "max_tokens": 12, "seed": SEED}


@pytest.fixture(scope="module")
def tiny() -> HFPolicy:
    return build_tiny_policy(seed=0)


@pytest.fixture(scope="module")
def served(tiny: HFPolicy) -> Any:
    with serving(tiny) as pair:
        yield pair


def _three_choices(gateway: Gateway, server: GatewayServer, rollout_id: str) -> Any:
    answer = rollout_client(server, rollout_id).chat.completions.create(**REQUEST, n=3)
    texts = [c.message.content.strip() for c in answer.choices]
    assert len(set(texts)) == 3, "the seeded choices should differ (pick another SEED)"
    return answer


# ----------------------------------------------------------------------------- sampling


def test_seeded_choices_are_the_single_calls_with_the_derived_seeds(served: Any) -> None:
    gateway, server = served
    answer = _three_choices(gateway, server, "n-seeded")
    assert [c.index for c in answer.choices] == [0, 1, 2]
    seeds = choice_seeds(SEED, 3)
    assert seeds[0] == SEED
    for i, seed in enumerate(seeds):
        single = rollout_client(server, f"n-single-{i}").chat.completions.create(
            **{**REQUEST, "seed": seed}
        )
        [one] = single.choices
        assert one.model_extra["token_ids"] == answer.choices[i].model_extra["token_ids"]
        assert one.message.content == answer.choices[i].message.content
        assert one.finish_reason == answer.choices[i].finish_reason
        [record] = rollout_records(gateway, f"n-single-{i}")
        holder = rollout_records(gateway, "n-seeded")[0]
        entry = record if i == 0 else holder["siblings"][i - 1]
        assert (entry["response_ids"], entry["logprobs"]) == (
            record["response_ids"],
            record["logprobs"],
        )
    # the same request again on a fresh rollout: the same three choices
    again = rollout_client(server, "n-seeded-again").chat.completions.create(**REQUEST, n=3)
    assert [c.model_extra["token_ids"] for c in again.choices] == [
        c.model_extra["token_ids"] for c in answer.choices
    ]


def test_usage_counts_the_prompt_once_and_every_choice(served: Any) -> None:
    gateway, server = served
    answer = _three_choices(gateway, server, "n-usage")
    prompt = answer.model_extra["prompt_token_ids"]
    lengths = [len(c.model_extra["token_ids"]) for c in answer.choices]
    assert answer.usage.prompt_tokens == len(prompt)
    assert answer.usage.completion_tokens == sum(lengths)
    assert answer.usage.total_tokens == len(prompt) + sum(lengths)


def test_unseeded_choices_are_rows_of_one_batched_call(tiny: HFPolicy) -> None:
    policy = ScriptedPolicy(tiny, lambda context: "forty-two")
    with Gateway(policy) as gateway, GatewayServer(gateway) as server:
        answer = rollout_client(server, "n-batch").chat.completions.create(
            model="m", messages=QUESTION, n=4
        )
        seeded = rollout_client(server, "n-seeds").chat.completions.create(
            model="m", messages=QUESTION, n=3, seed=5
        )
    assert [c.message.content for c in answer.choices] == ["forty-two"] * 4
    assert len(seeded.choices) == 3
    # one call of 4 rows, then (seeded) three calls of one row each
    assert policy.batches == [4, 1, 1, 1]
    assert gateway.served.batch_stats() == {"calls": 4, "requests": 2, "largest": 1}


# ----------------------------------------------------------------------------- records


def test_before_any_continuation_the_record_holds_choice_0_untrained(served: Any) -> None:
    gateway, server = served
    answer = _three_choices(gateway, server, "n-pending")
    [record] = rollout_records(gateway, "n-pending")
    ids = [c.model_extra["token_ids"] for c in answer.choices]
    assert record["response_ids"] == ids[0]
    assert record["choice"] == 0 and record["continued"] is False
    assert record["train"] is False
    assert [s["index"] for s in record["siblings"]] == [1, 2]
    assert [s["response_ids"] for s in record["siblings"]] == ids[1:]
    for sibling, choice in zip(record["siblings"], answer.choices[1:], strict=True):
        assert sibling["finish_reason"] == choice.finish_reason
        assert len(sibling["logprobs"]) == len(sibling["response_ids"])


def test_the_continued_choice_is_recorded_and_trains_the_others_do_not(
    served: Any, tiny: HFPolicy
) -> None:
    gateway, server = served
    client = rollout_client(server, "n-continued")
    answer = _three_choices(gateway, server, "n-continued")
    chosen = answer.choices[2]
    messages: list[Any] = [
        *QUESTION,
        {"role": "assistant", "content": chosen.message.content},
        {"role": "user", "content": "Are you sure?"},
    ]
    client.chat.completions.create(**{**REQUEST, "messages": messages, "seed": 99})
    first, second = rollout_records(gateway, "n-continued")
    ids = [c.model_extra["token_ids"] for c in answer.choices]
    assert first["response_ids"] == ids[2]
    assert first["choice"] == 2 and first["continued"] is True
    assert "train" not in first  # true: left out of the line
    assert [s["index"] for s in first["siblings"]] == [0, 1]
    assert [s["response_ids"] for s in first["siblings"]] == ids[:2]
    # the next turn extends exactly the continued choice's tokens
    context = first["prompt_ids"] + ids[2]
    if ids[2][-1] != tiny.eos_token_id:
        context.append(tiny.eos_token_id)
    assert second["prompt_ids"][: len(context)] == context
    assert second["context_rebuilt"] is False
    assert second["prompt"][1] == {"role": "assistant", "content": first["response"]}

    gateway.reward("n-continued", 1.0)
    records = [parse_record(r) for r in rollout_records(gateway, "n-continued")]
    assert trainable_rows(records) == [0, 1]
    table = TurnTable.from_records(records)
    advantages = compute_credit(table, "grpo").advantages
    batch = build_update_batch(records, table, advantages, None, "token-mean")
    assert batch.responses == [ids[2], second["response_ids"]]  # the siblings: nowhere


def test_a_choice_never_continued_is_not_trained(served: Any) -> None:
    """The last call (a vote, best-of-n): which choice earned the reward is unknown."""
    gateway, server = served
    answer = _three_choices(gateway, server, "n-last")
    gateway.reward("n-last", 1.0)
    [record] = rollout_records(gateway, "n-last")
    assert record["response_ids"] == answer.choices[0].model_extra["token_ids"]
    assert (record["continued"], record["train"], record["reward"], record["done"]) == (
        False,
        False,
        1.0,
        True,
    )
    assert trainable_rows([parse_record(record)]) == []


def test_a_request_that_continues_no_choice_leaves_the_turn_untrained(served: Any) -> None:
    gateway, server = served
    _three_choices(gateway, server, "n-rewritten")
    messages: list[Any] = [
        *QUESTION,
        {"role": "assistant", "content": "a summary of the three answers"},
        {"role": "user", "content": "Which one?"},
    ]
    rollout_client(server, "n-rewritten").chat.completions.create(
        **{**REQUEST, "messages": messages}
    )
    first, second = rollout_records(gateway, "n-rewritten")
    assert (first["choice"], first["continued"], first["train"]) == (0, False, False)
    assert second["context_rebuilt"] is True


def test_the_choice_fields_survive_a_log_line_and_the_table(served: Any) -> None:
    gateway, server = served
    _three_choices(gateway, server, "n-line")
    [line] = rollout_records(gateway, "n-line")
    record = parse_record(json.loads(json.dumps(line)))
    assert record_to_json(record) == line
    assert record.extra["siblings"] == line["siblings"]
    assert TurnTable.from_records([record]).n_rows == 1


def test_a_retried_call_with_choices_is_answered_again_and_recorded_once(served: Any) -> None:
    gateway, server = served
    client = rollout_client(server, "n-retry")
    first = client.chat.completions.create(**REQUEST, n=2)
    again = client.chat.completions.create(**REQUEST, n=2)
    assert again.model_dump() == first.model_dump()
    assert len(rollout_records(gateway, "n-retry")) == 1


# ----------------------------------------------------------------------------- streaming


def test_a_stream_carries_every_choice_by_index(served: Any) -> None:
    _, server = served
    plain = rollout_client(server, "n-plain").chat.completions.create(**REQUEST, n=2)
    stream = rollout_client(server, "n-stream").chat.completions.create(
        **REQUEST, n=2, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    for i in range(2):
        text = "".join(
            c.choices[0].delta.content or ""
            for c in chunks
            if c.choices and c.choices[0].index == i
        )
        assert text == plain.choices[i].message.content
        finish = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
        assert [f.index for f in finish] == [0, 1]
        assert finish[i].finish_reason == plain.choices[i].finish_reason
        assert finish[i].model_extra["token_ids"] == plain.choices[i].model_extra["token_ids"]
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


# ----------------------------------------------------------------------------- bounds


@pytest.mark.parametrize("n", [0, -1, MAX_CHOICES + 1, 2.0, "2", True, [2]])
def test_n_outside_1_to_16_is_a_400_naming_n(n: Any) -> None:
    with pytest.raises(GatewayError) as caught:
        parse_chat_request({"model": "m", "messages": QUESTION, "n": n})
    assert (caught.value.status, caught.value.param) == (400, "n")
    assert f"from 1 to {MAX_CHOICES}" in caught.value.message


def test_n_defaults_to_1_and_accepts_the_bound() -> None:
    assert parse_chat_request({"model": "m", "messages": QUESTION}).n == 1
    assert parse_chat_request({"model": "m", "messages": QUESTION, "n": None}).n == 1
    assert parse_chat_request({"model": "m", "messages": QUESTION, "n": MAX_CHOICES}).n == 16


def test_over_http_n_17_is_refused_and_recorded_nowhere(served: Any) -> None:
    gateway, server = served
    with pytest.raises(openai.BadRequestError) as caught:
        rollout_client(server, "n-17").chat.completions.create(**REQUEST, n=17)
    assert caught.value.body["param"] == "n"
    assert "n-17" not in [r["rollout_id"] for r in gateway.views.rollouts()]


# ----------------------------------------------------------------------------- seeds


def test_choice_seeds_hand_checked() -> None:
    assert choice_seeds(None, 3) == [None, None, None]
    assert choice_seeds(7, 1) == [7]
    assert choice_seeds(-3, 2)[0] == -3
    assert choice_seeds(7, 3)[:2] == choice_seeds(7, 2)  # a prefix: more choices add seeds


@given(seed=st.integers(-(2**63), 2**63 - 1), n=st.integers(1, MAX_CHOICES))
def test_choice_seeds_are_valid_distinct_request_seeds(seed: int, n: int) -> None:
    seeds = choice_seeds(seed, n)
    assert len(seeds) == n and seeds[0] == seed
    assert all(isinstance(s, int) and 0 <= s < 2**63 for s in seeds[1:])
    assert len(set(seeds[1:])) == n - 1
    assert choice_seeds(seed, n) == seeds
    parse_chat_request({"model": "m", "messages": QUESTION, "seed": max(seeds)})


def test_the_batcher_refuses_half_seeded_choices(tiny: HFPolicy) -> None:
    batcher = MicroBatcher(tiny)
    try:
        with pytest.raises(ValueError, match="seed every choice or none"):
            batcher.submit_choices([1, 2], seeds=[1, None], max_new_tokens=2, temperature=1.0)
        with pytest.raises(ValueError, match="at least one choice"):
            batcher.submit_choices([1, 2], seeds=[], max_new_tokens=2, temperature=1.0)
    finally:
        batcher.close()


def test_max_batch_counts_rows_and_never_splits_a_requests_choices(tiny: HFPolicy) -> None:
    policy = ScriptedPolicy(tiny, lambda context: "x")
    batcher = MicroBatcher(policy, window_s=0.0, max_batch=2)
    try:
        draws = batcher.submit_choices([1, 2], seeds=[None] * 3, max_new_tokens=2, temperature=1)
    finally:
        batcher.close()
    assert len(draws) == 3 and policy.batches == [3]
    assert np.all([d.policy_version == 0 for d in draws])
