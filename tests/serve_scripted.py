"""Scripted policies, a small calculator agent and HTTP helpers for the gateway tests.

A scripted policy (tiny tokenizer, deterministic replies) exercises the tool-call
path, which the random tiny model would hit only by chance.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import openai

from turnrl.envs.calculator import is_correct
from turnrl.envs.safe_math import calculate
from turnrl.envs.tools import FinalAnswer, parse_response
from turnrl.policy import HFPolicy
from turnrl.serve import Gateway, GatewayConfig, GatewayServer
from turnrl.types import Sample

CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "evaluates arithmetic",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
SYSTEM = "Be brief."
TOOLS_LINE = "<call>EXPRESSION</call> calculator: evaluates arithmetic"


# ----------------------------------------------------------------------------- policies


class ScriptedPolicy:
    """The ``Policy`` protocol on the tiny tokenizer with scripted, deterministic replies.

    ``reply(context_text)`` chooses the response text; it is tokenised, cut at
    ``max_new_tokens`` (``"length"``) or closed with the end-of-turn id (``"stop"``).
    Every token gets log-prob -0.25. ``batches`` records each call's batch size.
    """

    def __init__(
        self, base: HFPolicy, reply: Callable[[str], str], *, max_context: int | None = None
    ) -> None:
        self.base = base
        self.reply = reply
        self.eos_token_id = base.eos_token_id
        self.chat = base.chat  # text encoding: the gateway writes forced tool-call starts
        self.max_context = max_context if max_context is not None else base.max_context
        self.batches: list[int] = []

    def encode_initial(self, messages: list[dict[str, str]]) -> list[int]:
        return self.base.encode_initial(messages)

    def encode_observation(self, message: dict[str, str]) -> list[int]:
        return self.base.encode_observation(message)

    def decode(self, ids: list[int]) -> str:
        return self.base.decode(ids)

    def sample(
        self,
        contexts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[Sample]:
        self.batches.append(len(contexts))
        out = []
        for context in contexts:
            text = self.reply(self.base.tokenizer.decode(context))
            ids = list(self.base.tokenizer(text, add_special_tokens=False)["input_ids"])
            if len(ids) < max_new_tokens:
                ids, reason = [*ids, self.eos_token_id], "stop"
            else:
                ids, reason = ids[:max_new_tokens], "length"
            out.append(Sample(ids, [-0.25] * len(ids), reason, self.decode(ids)))
        return out


_TOOL_RESULT = re.compile(r"<\|im_start\|>t:(.*?)<\|im_end\|>\n<\|im_start\|>a:$", re.DOTALL)
_QUESTION = re.compile(r"Compute (.+?)\.")


def calculator_reply(context: str) -> str:
    """Call the calculator on the question's expression; answer once it has the result."""
    result = _TOOL_RESULT.search(context)
    if result:
        return f"<answer>{result.group(1)}</answer>"
    question = _QUESTION.findall(context)
    return f"Let me<call>{question[-1]}</call>" if question else "<answer>?</answer>"


class FailingPolicy(ScriptedPolicy):
    def sample(self, contexts: list[list[int]], **kwargs: Any) -> list[Sample]:
        raise RuntimeError("secret internal detail")


def calculator_agent(client: openai.OpenAI, question: str, *, max_turns: int = 4) -> float:
    """A small tool agent: ask, run the calculator on tool calls, return the reward."""
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question},
    ]
    for _ in range(max_turns):
        response = client.chat.completions.create(
            model="turnrl", messages=messages, tools=[CALCULATOR_TOOL], max_tokens=40
        )
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            action = parse_response(message.content or "")
            expected = float(calculate(_QUESTION.search(question).group(1)))
            return float(isinstance(action, FinalAnswer) and is_correct(action.text, expected))
        for call in message.tool_calls:
            argument = json.loads(call.function.arguments)["expression"]
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": calculate(argument)}
            )
    return 0.0


@contextlib.contextmanager
def serving(policy: Any, **config: Any) -> Iterator[tuple[Gateway, GatewayServer]]:
    """A gateway over ``policy`` (``config``: :class:`GatewayConfig` fields) and its HTTP
    server, both closed on exit."""
    with Gateway(policy, GatewayConfig(**config)) as gateway, GatewayServer(gateway) as server:
        yield gateway, server


def rollout_client(server: GatewayServer, rollout_id: str) -> openai.OpenAI:
    """The official client, pointed at the server's URL for one rollout."""
    return openai.OpenAI(base_url=server.base_url(rollout_id), api_key=server.api_key)


def rollout_records(gateway: Gateway, rollout_id: str) -> list[dict[str, Any]]:
    """The turn records the gateway holds for one rollout."""
    return gateway.views.rollout(rollout_id)["records"]


def auth(server: GatewayServer) -> dict[str, str]:
    """The ``Authorization`` header of ``server``'s key (for plain ``httpx`` calls)."""
    return {"Authorization": f"Bearer {server.api_key}"}


def post_reward(client: openai.OpenAI, reward: float) -> dict[str, Any]:
    """Report the final reward through the same client (``base_url`` + ``/reward``)."""
    return client.post("/reward", body={"reward": reward}, cast_to=object)


def assert_exact_prefixes(records: list[dict[str, Any]], eos: int) -> None:
    """Turn k+1's prompt ids start with turn k's prompt + response ids."""
    for before, after in itertools.pairwise(records):
        sampled = before["prompt_ids"] + before["response_ids"]
        if before["stop_reason"] == "length":
            sampled = [*sampled, eos]
        assert after["prompt_ids"][: len(sampled)] == sampled
        assert after["context_rebuilt"] is False


def raw_http(
    server: GatewayServer,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """One HTTP request with the standard library (for malformed bodies), with the
    server's key and a JSON content type unless ``headers`` set them."""
    sent = {"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"}
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers={**sent, **(headers or {})})
        response = connection.getresponse()
        text = response.read().decode()
    finally:
        connection.close()
    assert "Traceback" not in text
    return response.status, json.loads(text)


class BlockingPolicy(ScriptedPolicy):
    """Holds ``sample`` until released, to observe a rollout while it is busy."""

    def __init__(self, base: HFPolicy) -> None:
        super().__init__(base, calculator_reply)
        self.entered, self.release = threading.Event(), threading.Event()

    def sample(self, contexts: list[list[int]], **kwargs: Any) -> list[Sample]:
        self.entered.set()
        assert self.release.wait(30)
        return super().sample(contexts, **kwargs)


def chat_body(**overrides: Any) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **overrides}
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


def as_json(raw: bytes) -> dict[str, Any]:
    return json.loads(raw)


class GatedPolicy(ScriptedPolicy):
    """Samples only once ``gate`` is set (to hold a call in flight until a test lets go)."""

    def __init__(self, base: HFPolicy, reply: Callable[[str], str]) -> None:
        super().__init__(base, reply)
        self.gate = threading.Event()

    def sample(self, contexts: list[list[int]], **kwargs: Any) -> list[Sample]:
        assert self.gate.wait(60)
        return super().sample(contexts, **kwargs)
