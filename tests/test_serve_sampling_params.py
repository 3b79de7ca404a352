"""The standard sampling parameters through the official ``openai`` client, on exact tokens.

``stop`` (a string or a list), ``seed``, ``max_completion_tokens`` and ``n``'s bound: what
the completion says and what the turn record keeps (``turnrl.serve.stops``).
The scripted policy makes the replies known; the tiny model checks that a stop
string cuts a really sampled response at a prefix of the same draw.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from serve_scripted import ScriptedPolicy, rollout_client, rollout_records, serving
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.serve import Gateway, GatewayServer
from turnrl.serve.batcher import Sampled
from turnrl.serve.errors import GatewayError
from turnrl.serve.protocol import MAX_STOP_SEQUENCES, parse_chat_request
from turnrl.serve.stops import STOP_SEQUENCE, cut_at_stop
from turnrl.types import Sample

torch.set_num_threads(1)

REPLY = "Thought: add\nObservation: 42 then more"
SMOLAGENTS_STOPS = ["Observation:", "Calling tools:"]
QUESTION = [{"role": "user", "content": "What is 40+2?"}]


@pytest.fixture(scope="module")
def tiny() -> HFPolicy:
    return build_tiny_policy(seed=0)


@pytest.fixture(scope="module")
def scripted(tiny: HFPolicy) -> Any:
    with (
        Gateway(ScriptedPolicy(tiny, lambda context: REPLY)) as gateway,
        GatewayServer(gateway) as server,
    ):
        yield gateway, server


@pytest.fixture(scope="module")
def sampled(tiny: HFPolicy) -> Any:
    with serving(tiny) as pair:
        yield pair


def _ids(tiny: HFPolicy, text: str) -> list[int]:
    return list(tiny.tokenizer(text, add_special_tokens=False)["input_ids"])


# ----------------------------------------------------------------------------- stop


def test_a_stop_list_ends_the_response_at_the_completing_token(
    scripted: Any, tiny: HFPolicy
) -> None:
    gateway, server = scripted
    answer = rollout_client(server, "stop-list").chat.completions.create(
        model="m", messages=QUESTION, stop=SMOLAGENTS_STOPS, logprobs=True
    )
    choice = answer.choices[0]
    assert choice.message.content == "Thought: add\n"
    assert choice.finish_reason == "stop"
    # The tiny tokenizer has one token per character: "Thought: add\nObservation:" is
    # 25 characters, so the record keeps exactly the first 25 sampled tokens.
    kept = _ids(tiny, REPLY)[:25]
    assert tiny.decode(kept) == "Thought: add\nObservation:"
    [record] = rollout_records(gateway, "stop-list")
    assert record["response_ids"] == kept
    assert record["logprobs"] == [-0.25] * 25
    assert record["response"] == "Thought: add\nObservation:"
    assert record["stop_reason"] == STOP_SEQUENCE
    assert record["finish_reason"] == "stop"
    assert choice.model_extra["token_ids"] == kept
    assert [t.logprob for t in choice.logprobs.content] == [-0.25] * 25
    assert answer.usage.completion_tokens == 25


def test_the_next_turn_continues_after_the_kept_tokens_and_an_end_of_turn_id(
    scripted: Any, tiny: HFPolicy
) -> None:
    gateway, server = scripted
    client = rollout_client(server, "stop-next")
    first = client.chat.completions.create(model="m", messages=QUESTION, stop="Observation:")
    messages: list[Any] = [
        *QUESTION,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Observation: 42"},
    ]
    client.chat.completions.create(model="m", messages=messages, stop="Observation:")
    before, after = rollout_records(gateway, "stop-next")
    context = before["prompt_ids"] + before["response_ids"] + [tiny.eos_token_id]
    assert after["prompt_ids"][: len(context)] == context
    assert after["context_rebuilt"] is False


def test_a_reply_sent_back_stripped_still_extends_the_context(
    scripted: Any, tiny: HFPolicy
) -> None:
    """smolagents strips the content it sends back ("Thought: add\n" -> "Thought: add");
    the context keeps the sampled tokens, newline included, and is not rebuilt."""
    gateway, server = scripted
    client = rollout_client(server, "stop-stripped")
    first = client.chat.completions.create(model="m", messages=QUESTION, stop="Observation:")
    assert first.choices[0].message.content == "Thought: add\n"
    messages: list[Any] = [
        *QUESTION,
        {"role": "assistant", "content": "Thought: add"},
        {"role": "user", "content": "Observation: 42"},
    ]
    client.chat.completions.create(model="m", messages=messages, stop="Observation:")
    before, after = rollout_records(gateway, "stop-stripped")
    context = before["prompt_ids"] + before["response_ids"] + [tiny.eos_token_id]
    assert after["prompt_ids"][: len(context)] == context
    assert after["context_rebuilt"] is False
    assert after["prompt"][1] == {"role": "assistant", "content": "Thought: add\nObservation:"}


def test_a_stop_string_at_the_start_gives_empty_content(scripted: Any) -> None:
    gateway, server = scripted
    answer = rollout_client(server, "stop-first").chat.completions.create(
        model="m", messages=QUESTION, stop=["Thou"]
    )
    assert answer.choices[0].message.content == ""
    assert answer.choices[0].finish_reason == "stop"
    [record] = rollout_records(gateway, "stop-first")
    assert len(record["response_ids"]) == 4 and record["response"] == "Thou"


def test_a_stop_string_that_never_occurs_changes_nothing(scripted: Any, tiny: HFPolicy) -> None:
    gateway, server = scripted
    answer = rollout_client(server, "stop-none").chat.completions.create(
        model="m", messages=QUESTION, stop=["Calling tools:"]
    )
    assert answer.choices[0].message.content == REPLY
    [record] = rollout_records(gateway, "stop-none")
    assert record["response_ids"] == [*_ids(tiny, REPLY), tiny.eos_token_id]
    assert record["stop_reason"] == "stop"


def test_the_earliest_completed_stop_string_wins(scripted: Any) -> None:
    _, server = scripted
    answer = rollout_client(server, "stop-earliest").chat.completions.create(
        model="m", messages=QUESTION, stop=["then", "add"]
    )
    assert answer.choices[0].message.content == "Thought: "


def test_a_streamed_response_stops_the_same_way(scripted: Any) -> None:
    _, server = scripted
    stream = rollout_client(server, "stop-stream").chat.completions.create(
        model="m", messages=QUESTION, stop=SMOLAGENTS_STOPS, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "Thought: add\n"
    )
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_stop_cut_of_a_sampled_response_is_a_prefix_of_the_same_draw(
    sampled: Any, tiny: HFPolicy
) -> None:
    gateway, server = sampled
    request: dict[str, Any] = {"model": "m", "messages": QUESTION, "seed": 11, "max_tokens": 24}
    rollout_client(server, "draw-full").chat.completions.create(**request)
    [full] = rollout_records(gateway, "draw-full")
    ids = [i for i in full["response_ids"] if i != tiny.eos_token_id]
    # A stop string: the text token 6 adds, where it does not occur earlier.
    for k in range(6, len(ids)):
        head, piece = (
            tiny.decode(ids[: k - 1]),
            tiny.decode(ids[:k])[len(tiny.decode(ids[: k - 1])) :],
        )
        if piece and piece not in head:
            break
    else:
        pytest.fail("the draw has no token that adds new text")
    answer = rollout_client(server, "draw-cut").chat.completions.create(**request, stop=piece)
    [cut] = rollout_records(gateway, "draw-cut")
    assert cut["response_ids"] == ids[:k]
    assert cut["logprobs"] == full["logprobs"][:k]
    assert answer.choices[0].message.content == head
    assert answer.choices[0].finish_reason == "stop"


def test_cut_at_stop_without_stops_returns_the_sample_unchanged() -> None:
    sample = Sampled(Sample([5, 6, 3], [-0.1, -0.2, -0.3], "stop", "ab"), 7)
    assert cut_at_stop(sample, (), lambda ids: "never called") == (sample, "ab")


def test_cut_at_stop_keeps_the_shortest_prefix_and_the_version() -> None:
    letters = {1: "a", 2: "b", 3: "c", 4: "d"}
    sample = Sampled(Sample([1, 2, 3, 4], [-1.0, -2.0, -3.0, -4.0], "length", "abcd"), 2)
    cut, content = cut_at_stop(sample, ("bc", "d"), lambda ids: "".join(letters[i] for i in ids))
    assert content == "a"
    assert cut == Sampled(Sample([1, 2, 3], [-1.0, -2.0, -3.0], STOP_SEQUENCE, "abc"), 2)


PIECES = ("a", "b", "ab", "ba", "c", "")
"""Token texts of a made-up vocabulary: several letters per token, and an empty one."""


@given(
    ids=st.lists(st.integers(0, len(PIECES) - 1), max_size=12),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=3), min_size=1, max_size=3),
    ended=st.booleans(),
)
def test_cut_at_stop_keeps_exactly_the_tokens_up_to_the_first_completed_stop(
    ids: list[int], stops: list[str], ended: bool
) -> None:
    eos = len(PIECES)

    def decode(tokens: list[int]) -> str:
        return "".join(PIECES[t] for t in tokens if t != eos)

    response = [*ids, eos] if ended else ids
    logprobs = [-0.5 - i for i in range(len(response))]
    sample = Sampled(Sample(response, logprobs, "stop" if ended else "length", decode(ids)), 3)
    cut, content = cut_at_stop(sample, stops, decode)
    if not any(stop in decode(ids) for stop in stops):
        assert (cut, content) == (sample, decode(ids))
        return
    kept = cut.sample.response_ids
    assert kept == ids[: len(kept)]  # a prefix of the draw, without the end-of-turn id
    assert cut.sample.logprobs == logprobs[: len(kept)]
    assert any(stop in decode(kept) for stop in stops)  # completed at the last kept token
    assert not any(stop in decode(kept[:-1]) for stop in stops)
    assert cut.sample.text == decode(kept) and cut.sample.stop_reason == STOP_SEQUENCE
    assert cut.policy_version == 3
    start = min(i for i in (decode(kept).find(s) for s in stops) if i >= 0)
    assert content == decode(kept)[:start]
    assert decode(ids).startswith(content)


@pytest.mark.parametrize(
    ("stop", "param"),
    [
        ("", "stop"),
        ([""], "stop[0]"),
        (["ok", 3], "stop[1]"),
        (["x" * 257], "stop[0]"),
        ({"a": 1}, "stop"),
        ([str(i) for i in range(MAX_STOP_SEQUENCES + 1)], "stop"),
    ],
)
def test_bad_stop_values_are_a_400_naming_the_field(stop: Any, param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        parse_chat_request({"model": "m", "messages": QUESTION, "stop": stop})
    assert caught.value.status == 400 and caught.value.param == param


def test_stop_values_are_kept_once_in_order() -> None:
    request = parse_chat_request({"model": "m", "messages": QUESTION, "stop": ["b", "a", "b"]})
    assert request.stop == ("b", "a")
    assert parse_chat_request({"model": "m", "messages": QUESTION, "stop": None}).stop == ()


# ----------------------------------------------------------------------------- seed, budget, n


def test_the_same_seed_and_context_give_the_same_sample(sampled: Any) -> None:
    gateway, server = sampled
    request: dict[str, Any] = {"model": "m", "messages": QUESTION, "max_tokens": 12}
    for rollout_id, seed in (("seed-a", 3), ("seed-b", 3), ("seed-c", 4)):
        rollout_client(server, rollout_id).chat.completions.create(**request, seed=seed)
    [a], [b], [c] = (rollout_records(gateway, r) for r in ("seed-a", "seed-b", "seed-c"))
    assert (a["response_ids"], a["logprobs"]) == (b["response_ids"], b["logprobs"])
    assert (a["response_ids"], a["logprobs"]) != (c["response_ids"], c["logprobs"])


def test_max_completion_tokens_is_the_response_budget_and_wins_over_max_tokens(
    scripted: Any,
) -> None:
    gateway, server = scripted
    client = rollout_client(server, "budget")
    answer = client.chat.completions.create(model="m", messages=QUESTION, max_completion_tokens=3)
    assert answer.choices[0].message.content == "Tho"
    assert answer.choices[0].finish_reason == "length"
    again = rollout_client(server, "budget-both").chat.completions.create(
        model="m", messages=QUESTION, max_completion_tokens=2, max_tokens=30
    )
    assert again.choices[0].message.content == "Th"
    assert [len(r["response_ids"]) for r in rollout_records(gateway, "budget")] == [3]


def test_n_above_the_bound_is_a_400_that_says_why(scripted: Any) -> None:
    """``n`` from 1 to 16 is served (tests/test_serve_choices.py); above, a 400."""
    _, server = scripted
    client = rollout_client(server, "n-big")
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", messages=QUESTION, n=17)
    assert caught.value.body["param"] == "n"
    assert "from 1 to 16" in caught.value.body["message"]
    answer = client.chat.completions.create(model="m", messages=QUESTION, n=1)
    assert [c.index for c in answer.choices] == [0]
