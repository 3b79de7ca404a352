"""The tiny character-level tokenizer, chat template and model, and their save/load round trip."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from turnrl.policy import HFPolicy, build_tiny_model, build_tiny_tokenizer, load_tokenizer
from turnrl.policy.tiny import ALPHABET, IM_END, IM_START, PAD, UNK

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def test_special_tokens_and_ids(tokenizer) -> None:
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == [PAD, UNK, IM_START, IM_END]
    assert tokenizer.pad_token_id == 0
    assert tokenizer.unk_token_id == 1
    assert tokenizer.eos_token == IM_END
    assert tokenizer.eos_token_id == 3
    assert tokenizer.padding_side == "left"
    assert len(tokenizer) == 4 + len(ALPHABET) == 100


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=40))
def test_one_token_per_character_and_exact_decode(tokenizer, text: str) -> None:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text


def test_unknown_characters_map_to_unk(tokenizer) -> None:
    assert tokenizer("aé\tb", add_special_tokens=False)["input_ids"] == [
        tokenizer.convert_tokens_to_ids("a"),
        1,
        1,
        tokenizer.convert_tokens_to_ids("b"),
    ]


def test_special_tokens_in_text_are_single_tokens(tokenizer) -> None:
    ids = tokenizer(f"{IM_START}a:x{IM_END}", add_special_tokens=False)["input_ids"]
    assert ids == [2, *tokenizer.convert_tokens_to_ids(["a", ":", "x"]), 3]


def test_chat_template_renders_compact_chatml(tokenizer) -> None:
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "calc"},
        {"role": "tool", "content": "4"},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>s:S<|im_end|>\n"
        "<|im_start|>u:2+2?<|im_end|>\n"
        "<|im_start|>a:calc<|im_end|>\n"
        "<|im_start|>t:4<|im_end|>\n"
        "<|im_start|>a:"
    )
    no_prompt = tokenizer.apply_chat_template(messages[:1], tokenize=False)
    assert no_prompt == "<|im_start|>s:S<|im_end|>\n"


def test_chat_template_rejects_unknown_role(tokenizer) -> None:
    with pytest.raises(Exception, match="unknown chat role: critic"):
        tokenizer.apply_chat_template([{"role": "critic", "content": "x"}], tokenize=False)


def test_model_size_and_seeded_init(tokenizer) -> None:
    model = build_tiny_model(tokenizer, seed=3)
    n_params = sum(p.numel() for p in model.parameters())
    assert 100_000 <= n_params <= 300_000
    assert model.config.tie_word_embeddings
    assert model.config.vocab_size == len(tokenizer)
    same = build_tiny_model(tokenizer, seed=3)
    other = build_tiny_model(tokenizer, seed=4)
    weight = model.model.embed_tokens.weight
    assert torch.equal(weight, same.model.embed_tokens.weight)
    assert not torch.equal(weight, other.model.embed_tokens.weight)


def test_building_a_model_leaves_the_global_rng_alone(tokenizer) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tokenizer, seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_save_load_round_trip(tokenizer, tmp_path) -> None:
    model = build_tiny_model(tokenizer, seed=1)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)

    loaded_tok = load_tokenizer(tmp_path)
    assert loaded_tok.chat_template == tokenizer.chat_template
    assert loaded_tok.all_special_tokens == tokenizer.all_special_tokens
    assert (loaded_tok.eos_token_id, loaded_tok.pad_token_id, loaded_tok.unk_token_id) == (3, 0, 1)
    assert loaded_tok.padding_side == "left"
    messages = [{"role": "user", "content": "hi\nthere"}, {"role": "tool", "content": "{}"}]
    for tok in (tokenizer, loaded_tok):
        assert tok.apply_chat_template(messages, tokenize=False).count(IM_END) == 2
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert (
        loaded_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == text
    )
    assert loaded_tok(text)["input_ids"] == tokenizer(text)["input_ids"]

    policy = HFPolicy.from_pretrained(tmp_path)
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        got = policy.model(input_ids=ids).logits
    assert torch.equal(expected, got)


# Text the tiny model can represent: its characters, its special tokens, chat markup.
_PIECES = st.one_of(
    st.text(alphabet=ALPHABET, min_size=1, max_size=12),
    st.sampled_from([PAD, UNK, IM_START, IM_END, " ", "\n", "  ", " \n", "\n\n"]),
)


@pytest.fixture(scope="module")
def standard_load(tmp_path_factory):
    """A policy saved by turnrl, loaded back with the standard transformers calls."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from turnrl.policy import build_tiny_policy

    directory = tmp_path_factory.mktemp("tiny-saved")
    policy = build_tiny_policy(seed=2)
    policy.save(directory)
    model = AutoModelForCausalLM.from_pretrained(directory)
    return policy, AutoTokenizer.from_pretrained(directory), model


@settings(max_examples=200, deadline=None)
@given(st.lists(_PIECES, max_size=12).map("".join))
def test_standard_autotokenizer_gives_turnrl_ids(standard_load, text: str) -> None:
    """AutoTokenizer builds transformers' Qwen2Tokenizer from the saved files: same ids."""
    policy, auto, _ = standard_load
    ids = policy.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert auto(text, add_special_tokens=False)["input_ids"] == ids
    assert auto.decode(ids) == policy.tokenizer.decode(ids)
    if UNK not in text:
        assert auto.decode(ids) == text


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["system", "user", "assistant", "tool"]),
            st.text(alphabet=ALPHABET, max_size=20),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_standard_load_chat_template_ids_and_logits(standard_load, turns) -> None:
    policy, auto, model = standard_load
    messages = [{"role": role, "content": content} for role, content in turns]
    ids = policy.encode_initial(messages)
    got = auto.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert list(got["input_ids"]) == ids
    assert (auto.eos_token_id, auto.pad_token_id, auto.padding_side) == (3, 0, "left")
    with torch.no_grad():
        want = policy.model(input_ids=torch.tensor([ids])).logits
        assert torch.equal(model(input_ids=torch.tensor([ids])).logits, want)


def test_characters_outside_the_alphabet(standard_load) -> None:
    """The one documented difference: turnrl says <|unk|>, Qwen2Tokenizer drops them."""
    policy, auto, _ = standard_load
    a, b = policy.tokenizer.convert_tokens_to_ids(["a", "b"])
    assert policy.tokenizer("aé\tb", add_special_tokens=False)["input_ids"] == [a, 1, 1, b]
    assert auto("aé\tb", add_special_tokens=False)["input_ids"] == [a, b]


def test_save_and_load_print_no_transformers_progress_bars(tmp_path, capfd) -> None:
    """A run's output is turnrl's own: no "Writing model shards" / "Loading weights" bars."""
    from transformers.utils import logging as hf_logging

    from turnrl.policy import build_tiny_policy

    assert hf_logging.is_progress_bar_enabled()
    build_tiny_policy(seed=0).save(tmp_path)
    HFPolicy.from_pretrained(tmp_path)
    out, err = capfd.readouterr()
    assert "shards" not in out + err and "Loading weights" not in out + err
    assert hf_logging.is_progress_bar_enabled()  # restored for everyone else
    model = build_tiny_model(build_tiny_tokenizer())
    model.save_pretrained(tmp_path / "plain")  # transformers itself still shows its bar
    assert "Writing model shards" in "".join(capfd.readouterr())
