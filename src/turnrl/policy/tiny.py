"""A tiny, offline character-level chat model for tests, examples and smoke runs.

Nothing here downloads anything: the tokenizer is built in code with the
``tokenizers`` library (one token per character, plus a few special tokens) and
the model is a randomly initialised ``Qwen2ForCausalLM`` of about 0.1M
parameters, so every layer above ``policy`` can be exercised on a CPU in seconds.

Saved directories load with the standard ``AutoTokenizer.from_pretrained``, which
for a ``qwen2`` model builds transformers' own ``Qwen2Tokenizer`` from the saved
vocabulary and ignores the saved pre-tokenizer: a byte-level BPE (bytes mapped to
printable characters, e.g. space to ``Ġ``). The vocabulary is therefore stored
in that byte-level spelling, and this tokenizer maps text to it the same way, so
both give the same ids on every text made of :data:`ALPHABET` characters and the
special tokens. A character outside the alphabet becomes ``<|unk|>`` here and is
dropped by ``Qwen2Tokenizer`` (whose BPE has no unknown token).

The chat template is ChatML-like but compact, because every character of markup
costs one token for a character-level model::

    <|im_start|>u:What is 2+2?<|im_end|>\\n<|im_start|>a:4<|im_end|>\\n

Role markers are one letter: ``s`` (system), ``u`` (user), ``a`` (assistant),
``t`` (tool). The generation prompt is ``<|im_start|>a:``; an assistant turn
ends with ``<|im_end|>`` (the tokenizer's eos token), and the template puts a
newline between turns, like Qwen's template does.
"""

from __future__ import annotations

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|pad|>"
UNK = "<|unk|>"
SPECIAL_TOKENS = (PAD, UNK, IM_START, IM_END)
"""Special tokens, in id order (``<|pad|>`` is id 0)."""

ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))
"""Ordinary tokens: newline and the printable ASCII characters (space to ``~``)."""

MAX_POSITIONS = 4096
"""Context of the tiny model (prompt plus response), in tokens."""

ROLE_MARKERS = {"system": "s", "user": "u", "assistant": "a", "tool": "t"}

CHAT_TEMPLATE = (
    "{%- set markers = {'system': 's', 'user': 'u', 'assistant': 'a', 'tool': 't'} -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in markers -%}"
    "{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{%- endif -%}"
    "{{ '"
    + IM_START
    + "' + markers[message['role']] + ':' + message['content'] + '"
    + IM_END
    + "\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '" + IM_START + "a:' }}{%- endif -%}"
)
"""Jinja chat template (compact ChatML); unknown roles raise an error."""


def byte_level_spelling(char: str) -> str:
    """How a byte-level BPE vocabulary spells the ASCII character ``char``.

    GPT-2's byte-to-unicode map (what ``tokenizers``' ``ByteLevel`` applies):
    printable bytes stand for themselves, the others (space, newline, ...) are
    shifted to ``U+0100`` onwards, in byte order.
    """
    code = ord(char)
    if code > 0x7F:
        raise ValueError(f"{char!r} is not an ASCII character (one byte in UTF-8)")
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    if code in printable:
        return char
    return chr(0x100 + [b for b in range(0x100) if b not in printable].index(code))


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer with its chat template.

    A ``WordLevel`` model over single characters in byte-level spelling (see the
    module docstring): the pre-tokenizer isolates every character and spells it
    as ``ByteLevel`` does, characters outside :data:`ALPHABET` map to
    ``<|unk|>``, and the ``ByteLevel`` decoder turns tokens back into text.
    Padding is on the left (what batched generation wants).
    """
    spelled = [byte_level_spelling(char) for char in ALPHABET]
    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *spelled))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # [\s\S] rather than "." so that the newline is a character too.
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated"),
            ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=None,
        padding_side="left",
        model_max_length=4096,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 192,
    max_positions: int = MAX_POSITIONS,
) -> Qwen2ForCausalLM:
    """A randomly initialised small ``Qwen2ForCausalLM`` matching ``tokenizer``.

    With the defaults it has about 0.1M parameters (embeddings tied to the output
    layer). ``seed`` fixes the initial weights; the global torch RNG is restored
    afterwards, so building a model does not disturb other random streams.
    """
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        use_sliding_window=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()
