"""Stop sequences on exact tokens: cut a sampled response where a stop string completes.

The policy samples token by token up to ``max_tokens`` (or its end-of-turn id);
the gateway then keeps the shortest prefix of the sampled tokens whose decoded
text contains one of the request's stop strings. Cutting afterwards is exact:
sampling is autoregressive, so the kept tokens and their log-probs are exactly
what a sampler that stopped at that token would have drawn; the tokens after it
are dropped (they cost sampling time, nothing else).

How text and tokens relate (the agent sees the first, the update trains on the
second):

* ``response_ids`` / ``logprobs`` (the turn record): every sampled token up to
  and including the one that completes the stop string; no end-of-turn id.
* ``response`` (the record) and the text the gateway keeps as the assistant
  turn: ``decode(response_ids)``, which ends with the stop string (and, when the
  completing token carries more characters after it, those too).
* the completion's ``content``: that text up to where the stop string starts,
  without the stop string, as OpenAI returns it; ``finish_reason`` ``"stop"``;
  its ``logprobs``, ``token_ids`` and ``usage`` count the recorded tokens.
* ``stop_reason`` :data:`STOP_SEQUENCE`; the next turn's context appends the
  end-of-turn id after the kept tokens, as after a response cut at ``max_tokens``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from turnrl.serve.batcher import Sampled

STOP_SEQUENCE = "stop_sequence"
"""The record's ``stop_reason`` when a stop string ended the response."""


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the earliest stop string in ``text`` starts, or ``None``."""
    starts = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    return min(starts) if starts else None


def cut_at_stop(
    sampled: Sampled, stops: Sequence[str], decode: Callable[[list[int]], str]
) -> tuple[Sampled, str]:
    """The sample cut after the token that completes a stop string, and the content.

    Without ``stops``, or when no stop string occurs in the response, the sample
    comes back unchanged with its text as the content. ``decode`` turns response
    ids into text (the policy's ``decode``).
    """
    sample = sampled.sample
    if not stops:
        return sampled, sample.text
    ids = list(sample.response_ids)
    if sample.stop_reason == "stop":
        ids = ids[:-1]  # the end-of-turn id carries no text

    def stopped(k: int) -> bool:
        return first_stop(decode(ids[:k]), stops) is not None

    if not ids or not stopped(len(ids)):
        return sampled, sample.text
    # The shortest prefix containing a stop string (decoded text grows with the prefix).
    low, high = 1, len(ids)
    while low < high:
        mid = (low + high) // 2
        if stopped(mid):
            high = mid
        else:
            low = mid + 1
    text = decode(ids[:low])
    start = first_stop(text, stops)
    assert start is not None
    cut = dataclasses.replace(
        sample,
        response_ids=ids[:low],
        logprobs=list(sample.logprobs[:low]),
        stop_reason=STOP_SEQUENCE,
        text=text,
    )
    return dataclasses.replace(sampled, sample=cut), text[:start]
