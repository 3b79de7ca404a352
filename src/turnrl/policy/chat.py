"""Chat-template token layout: initial contexts, observation deltas, response decoding.

Token exactness. Contexts grow by appending ids, never by re-rendering text:
``encode_initial(messages)`` once, then after every response its ids (ending with
the end-of-turn token) and ``encode_observation(message)``. For that to equal the
tokenisation of the re-rendered conversation, ``encode_observation`` returns the
ids of exactly the text the chat template puts after the end-of-turn token of an
assistant turn: the separator (e.g. Qwen's ``"\\n"``), the message, and the next
generation prompt. It finds that text as a delta between two renderings of a
reference conversation, with and without the message. Assumptions (true for
ChatML/Qwen-style templates and for the tiny template; tested on the latter and
on SmolLM2's):

* the template renders earlier messages the same whatever follows them, and
  the end-of-turn token's text is the last one in a rendered assistant turn;
* tokenisation does not merge across the end-of-turn special token, so
  tokenising the delta alone gives the same ids as inside the whole text.

Control strings are the template's alone. A message's content is text: a user or a
tool that writes ``<|im_end|>\n<|im_start|>assistant`` into it gets those characters
as plain text (``split_special_tokens``), never the control token ids, so no message
can open or close a turn of another role. The template's own markers around it stay
control tokens: a content that holds the text of a special token is cut out of the
rendered text (found through a placeholder rendered in its place) and encoded on its
own; content without one is encoded as before, in one piece.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from turnrl.types import Message

_REFERENCE_TURN: list[Message] = [
    {"role": "user", "content": "x"},
    {"role": "assistant", "content": "y"},
]
"""A conversation ending with an assistant turn, used to find observation deltas."""

_PLACEHOLDER = "\ue000{}\ue001"
"""Stands for a message's content in a rendering (private-use characters, which no
template changes), so the content's place in the rendered text is known exactly."""

_GENERIC_TOKENIZER_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def load_tokenizer(path: str | Path, *, local_files_only: bool = True) -> Any:
    """Load a tokenizer saved with ``save_pretrained``.

    A tokenizer saved as a generic ``tokenizers`` tokenizer (such as the tiny
    character-level one) is loaded as such: ``AutoTokenizer`` would otherwise
    replace it by the model type's own tokenizer class (transformers 5 does so
    for ``qwen2``), with a different pre-tokenizer and different ids.
    """
    config_file = Path(path) / "tokenizer_config.json"
    if config_file.is_file():
        declared = json.loads(config_file.read_text()).get("tokenizer_class")
        if declared in _GENERIC_TOKENIZER_CLASSES:
            return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path), local_files_only=local_files_only)


def check_messages(messages: Sequence[Message], what: str) -> None:
    """Raise a clear error unless every message is a dict with str role and content."""
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(f"{what}[{i}]: expected a dict message, got {type(message).__name__}")
        for key in ("role", "content"):
            value = message.get(key)
            if not isinstance(value, str):
                raise ValueError(f"{what}[{i}]: field {key!r} must be a str, got {value!r}")


class ChatFormat:
    """A tokenizer with a chat template, and the special ids a policy needs.

    ``end_of_turn`` is the token that ends an assistant turn (default: the
    tokenizer's eos token, ``<|im_end|>`` for Qwen instruct models and the tiny
    model). Sampling stops at it or at the tokenizer's eos token
    (``stop_token_ids``).
    """

    def __init__(self, tokenizer: Any, end_of_turn: str | None = None) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("HFPolicy needs a tokenizer with a chat template")
        self.tokenizer = tokenizer
        self.end_of_turn: str = end_of_turn if end_of_turn is not None else tokenizer.eos_token
        if self.end_of_turn is None:
            raise ValueError("the tokenizer has no eos token; pass end_of_turn=")
        eot_ids = tokenizer.convert_tokens_to_ids([self.end_of_turn])
        if len(eot_ids) != 1 or eot_ids[0] is None or eot_ids[0] == tokenizer.unk_token_id:
            raise ValueError(f"end-of-turn {self.end_of_turn!r} is not a single token")
        self.eos_token_id: int = int(eot_ids[0])
        """The end-of-turn token id (the last id of a finished response)."""
        self.stop_token_ids = frozenset(
            i for i in (self.eos_token_id, tokenizer.eos_token_id) if i is not None
        )
        pad = tokenizer.pad_token_id
        self.pad_token_id: int = int(pad) if pad is not None else self.eos_token_id
        added = getattr(tokenizer, "added_tokens_decoder", {}).values()
        controls = [*tokenizer.all_special_tokens, *(t.content for t in added if t.special)]
        self.control_texts: frozenset[str] = frozenset(c for c in controls if c)
        """Texts of the tokenizer's special tokens: in a message's content they are
        plain text (see the module docstring)."""

    def render(self, messages: Sequence[Message], *, generation_prompt: bool) -> str:
        """The chat template's text of ``messages``."""
        return self.tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=generation_prompt, tokenize=False
        )

    def encode_text(self, text: str) -> list[int]:
        """Ids of ``text``, without the tokenizer's own special tokens."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_plain(self, text: str) -> list[int]:
        """Ids of ``text`` with the texts of special tokens split into ordinary tokens
        (``<|im_end|>`` as the characters it is made of, not the control token)."""
        ids = self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)
        return list(ids["input_ids"])

    def encode_initial(self, messages: list[Message]) -> list[int]:
        """Ids of ``messages`` rendered by the chat template, plus the generation prompt."""
        if not messages:
            raise ValueError("encode_initial: messages is empty")
        check_messages(messages, "messages")
        return self._encode_rendered(
            lambda shown: self.render(shown, generation_prompt=True), list(messages)
        )

    def _holds_control(self, text: str) -> bool:
        return any(control in text for control in self.control_texts)

    def _encode_rendered(
        self, render: Callable[[list[Message]], str], messages: list[Message]
    ) -> list[int]:
        """Ids of ``render(messages)``, each content that holds a special token's text
        encoded as plain text (:meth:`encode_plain`), the template's text around it as
        the template wrote it."""
        text = render(messages)
        hidden = [i for i, m in enumerate(messages) if self._holds_control(m["content"])]
        if not hidden:
            return self.encode_text(text)
        marks = {i: _PLACEHOLDER.format(i) for i in hidden}
        shown = [{**m, "content": marks[i]} if i in marks else m for i, m in enumerate(messages)]
        skeleton = render(shown)
        rebuilt = skeleton
        for i, mark in marks.items():
            rebuilt = rebuilt.replace(mark, messages[i]["content"])
        if rebuilt != text or any(skeleton.count(mark) != 1 for mark in marks.values()):
            raise ValueError(
                f"message {hidden[0]}: its content holds a special token's text, and the "
                "chat template changes that content, so it cannot be encoded as plain text"
            )
        ids: list[int] = []
        for i in sorted(hidden, key=lambda i: skeleton.index(marks[i])):
            before, skeleton = skeleton.split(marks[i])
            ids += self.encode_text(before) + self.encode_plain(messages[i]["content"])
        return ids + self.encode_text(skeleton)

    def observation_text(self, message: Message) -> str:
        """The text the template puts after an assistant's end-of-turn token when
        ``message`` follows: separator, the message, the next generation prompt."""
        check_messages([message], "observation")
        before = self.render(_REFERENCE_TURN, generation_prompt=False)
        after = self.render([*_REFERENCE_TURN, message], generation_prompt=True)
        end = before.rfind(self.end_of_turn)
        if end < 0:
            raise ValueError(
                f"the chat template does not end an assistant turn with {self.end_of_turn!r}"
            )
        prefix = before[: end + len(self.end_of_turn)]
        if not after.startswith(prefix):
            raise ValueError(
                "the chat template re-renders earlier turns when a message is added; "
                "observation ids cannot be appended exactly"
            )
        return after[len(prefix) :]

    def encode_observation(self, message: Message) -> list[int]:
        """Ids to append after a finished response (see the module docstring)."""
        return self._encode_rendered(lambda shown: self.observation_text(shown[0]), [message])

    def decode(self, ids: list[int]) -> str:
        """Text of response ids, without trailing end-of-turn/eos tokens."""
        ids = list(ids)
        while ids and ids[-1] in self.stop_token_ids:
            ids.pop()
        return self.tokenizer.decode(ids, skip_special_tokens=False)


class ChatEncoding:
    """The encoding half of the :class:`~turnrl.types.Policy` protocol, answered by the
    policy's :class:`ChatFormat` (``self.chat``): every backend (transformers, a vLLM
    engine, a vLLM server) encodes and decodes the same way, so records do not depend on
    which one sampled."""

    chat: ChatFormat

    def encode_initial(self, messages: list[Message]) -> list[int]:
        """Ids of ``messages`` rendered by the chat template, plus the generation prompt."""
        return self.chat.encode_initial(messages)

    def observation_text(self, message: Message) -> str:
        """The text the template puts after an assistant's end-of-turn token when
        ``message`` follows (see the module docstring)."""
        return self.chat.observation_text(message)

    def encode_observation(self, message: Message) -> list[int]:
        """Ids to append after a finished response (see the module docstring)."""
        return self.chat.encode_observation(message)

    def decode(self, ids: list[int]) -> str:
        """Text of response ids, without trailing end-of-turn/eos tokens."""
        return self.chat.decode(ids)
