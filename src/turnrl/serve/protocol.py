"""The OpenAI chat-completions request, validated into small frozen dataclasses.

:func:`parse_chat_request` checks a decoded JSON body field by field and raises
:class:`~turnrl.serve.errors.GatewayError` (HTTP 400) naming the offending field
as a JSON path (``messages[2].role``), the way the OpenAI API does.

What is accepted:

* ``messages``: roles ``system``, ``developer`` (read as ``system``), ``user``,
  ``assistant`` (``content`` may be null when ``tool_calls`` is given) and
  ``tool`` (needs ``tool_call_id``). ``content`` is a string or a list of
  ``{"type": "text", "text": ...}`` parts (joined without separator).
* ``tools``: function tools ``{"type": "function", "function": {"name",
  "description"?, "parameters"?}}``; ``tool_choice`` ``"auto"``, ``"none"``,
  ``"required"`` or a named function ``{"type": "function", "function": {"name"}}``
  (one of ``tools``): the last two force a call (the start of the call block is written
  into the context, :func:`turnrl.serve.toolcalls.forced_call_prefix`);
  ``parallel_tool_calls`` (a boolean: at most one call is parsed per reply either
  way, see ``docs/gateway.md``).
* ``model``: any name of at most 256 printable characters; it becomes the turn
  record's ``role`` (so several agents of one program are told apart).
* ``temperature`` (0 to 2), ``max_completion_tokens`` / ``max_tokens`` (the
  former wins; the newer name, same meaning), ``seed`` (same seed and context,
  same sample), ``logprobs``, ``n`` (1 to :data:`MAX_CHOICES`, see below),
  ``stream`` and ``stream_options.include_usage``, ``top_logprobs`` (0 only).
* ``stop``: a string or a list of at most :data:`MAX_STOP_SEQUENCES` non-empty
  strings. The response ends at the token that completes the first stop string
  (:mod:`turnrl.serve.stops`): ``finish_reason`` is ``"stop"``, the content is
  the text before the stop string (as OpenAI returns it), and the turn record
  keeps every sampled token up to and including the completing one.

``n`` > 1 asks for several choices sampled from the same context (self-consistency,
best-of-n). The turn record keeps the choice the agent continued and the others as its
siblings, not trained (:mod:`turnrl.serve.choices`, ``docs/gateway.md``).

Parameters that would change the sampling distribution and that the policy
cannot honour (``top_p`` other than 1, penalties, ``logit_bias``, a
``response_format`` other than text) are refused with a 400 rather than silently
ignored: a recorded log-prob must be the log-prob of what was really sampled. A
forced tool call is not such an option: the forced tokens are written into the
context, not sampled, and recorded on the prompt side. Everything else (``user``,
``metadata``, ``store``...) is ignored.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from turnrl.serve.errors import bad_request
from turnrl.serve.jsonbody import loads_or_none

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
"""Message roles a request may use (``developer`` is read as ``system``)."""

TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
"""Tool names the tool-call parsers can read back (a subset of OpenAI's)."""

MAX_MODEL_LENGTH = 256
"""Longest ``model`` name accepted (it becomes the record's ``role``)."""

_REFUSED_UNLESS_DEFAULT: dict[str, Any] = {
    "top_p": 1,
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "logit_bias": None,
}
"""Sampling options the policy cannot honour: accepted only at their no-op value."""

MAX_STOP_SEQUENCES = 16
"""Most stop strings one request may give (OpenAI allows 4, vLLM more)."""

MAX_STOP_LENGTH = 256
"""Longest stop string accepted, in characters."""

MAX_CHOICES = 16
"""Largest ``n`` (choices of one call): each costs a sample, so one request stays bounded."""


@dataclass(frozen=True)
class FunctionCall:
    """One tool call of an assistant message.

    ``arguments`` is the JSON string as sent (OpenAI allows invalid JSON there);
    ``parsed`` is its decoded value, or ``None`` when it does not parse.
    """

    id: str
    name: str
    arguments: str
    parsed: Any = None


@dataclass(frozen=True)
class ChatMessage:
    """One validated request message (``role`` never ``developer``)."""

    role: str
    content: str | None
    tool_calls: tuple[FunctionCall, ...] = ()
    tool_call_id: str | None = None

    def key(self) -> tuple[Any, ...]:
        """What identifies the message for the "does this request extend the last
        one" check: role, text and tool calls (name and decoded arguments), not ids.
        An assistant's text is compared without surrounding whitespace: frameworks such
        as smolagents strip the replies they send back (a reply cut before a stop string
        often ends with a newline), and the context keeps the tokens really sampled."""
        calls = tuple(
            (c.name, json.dumps(c.parsed, sort_keys=True) if c.parsed is not None else c.arguments)
            for c in self.tool_calls
        )
        text = self.content or ""
        return (self.role, text.strip() if self.role == "assistant" else text, calls)


@dataclass(frozen=True)
class ToolSpec:
    """A function tool offered in the request."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def parameter_names(self) -> tuple[str, ...]:
        """Names in ``parameters.properties``, in the order given."""
        properties = self.parameters.get("properties")
        return tuple(properties) if isinstance(properties, dict) else ()

    @property
    def primary_parameter(self) -> str | None:
        """The single argument's name, for tools with at most one parameter
        (``"input"`` when none is declared); ``None`` for several parameters."""
        names = self.parameter_names
        if not names:
            return "input"
        return names[0] if len(names) == 1 else None


@dataclass(frozen=True)
class ChatRequest:
    """A validated ``POST /v1/chat/completions`` body."""

    model: str
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "auto"
    """``"auto"``, ``"none"`` or ``"required"`` (a named function is ``"required"``
    with :attr:`forced_function` set)."""
    forced_function: str | None = None
    """The function ``tool_choice`` names (one of :attr:`tools`), if it names one."""
    parallel_tool_calls: bool = True
    """``parallel_tool_calls`` as sent (at most one call is parsed per reply anyway)."""
    temperature: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    """Stop strings (``stop``); the response ends where the first one is completed."""
    n: int = 1
    """Choices to sample from the same context (``n``, 1 to :data:`MAX_CHOICES`)."""
    logprobs: bool = False
    stream: bool = False
    include_usage: bool = False
    """``stream_options.include_usage``: end the stream with a usage chunk."""

    @property
    def role(self) -> str:
        """The turn record's ``role``: the model name the agent asked for."""
        return self.model

    def characters(self) -> int:
        """Characters of text the request asks the policy to read: message contents,
        tool calls and tool descriptions (what tokenising would cost)."""
        total = 0
        for message in self.messages:
            total += len(message.content or "")
            total += sum(len(c.name) + len(c.arguments) for c in message.tool_calls)
        for tool in self.tools:
            total += len(tool.name) + len(tool.description) + len(json.dumps(tool.parameters))
        return total


def tools_key(tools: tuple[ToolSpec, ...]) -> str:
    """Canonical JSON of a tool set (a change of tools changes the prompt)."""
    return json.dumps([[t.name, t.description, t.parameters] for t in tools], sort_keys=True)


# ----------------------------------------------------------------------------- helpers


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """A JSON number (not a bool) that is finite as a float (huge ints are not)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _typename(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _content(value: Any, param: str, *, nullable: bool) -> str | None:
    """A message's text: a string, or a list of text parts joined."""
    if value is None:
        if nullable:
            return None
        raise bad_request(f"{param} is required (a string)", param)
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            where = f"{param}[{i}]"
            if not isinstance(part, dict) or part.get("type") != "text":
                raise bad_request(f"{where}: only text content parts are supported", where)
            if not isinstance(part.get("text"), str):
                raise bad_request(f"{where}.text must be a string", f"{where}.text")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"{param} must be a string or a list of text parts", param)


def _tool_calls(value: Any, param: str) -> tuple[FunctionCall, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad_request(f"{param} must be a list", param)
    calls = []
    for i, call in enumerate(value):
        where = f"{param}[{i}]"
        if not isinstance(call, dict):
            raise bad_request(f"{where} must be an object", where)
        if call.get("type", "function") != "function":
            raise bad_request(f"{where}.type must be 'function'", f"{where}.type")
        function = call.get("function")
        if not isinstance(function, dict):
            raise bad_request(f"{where}.function must be an object", f"{where}.function")
        name, arguments = function.get("name"), function.get("arguments", "")
        if not isinstance(name, str) or not name:
            raise bad_request(f"{where}.function.name must be a string", f"{where}.function.name")
        if not isinstance(arguments, str):
            raise bad_request(
                f"{where}.function.arguments must be a JSON string", f"{where}.function.arguments"
            )
        call_id = call.get("id", "")
        if not isinstance(call_id, str):
            raise bad_request(f"{where}.id must be a string", f"{where}.id")
        calls.append(FunctionCall(call_id, name, arguments, loads_or_none(arguments)))
    return tuple(calls)


def parse_message(obj: Any, index: int) -> ChatMessage:
    """Validate ``messages[index]``."""
    param = f"messages[{index}]"
    if not isinstance(obj, dict):
        raise bad_request(f"{param} must be an object, got {_typename(obj)}", param)
    role = obj.get("role")
    if not isinstance(role, str) or role not in ROLES:  # a list or dict is not hashable
        raise bad_request(
            f"{param}.role must be one of {sorted(ROLES)}, got {role!r}", f"{param}.role"
        )
    if role == "developer":
        role = "system"
    tool_calls = _tool_calls(obj.get("tool_calls"), f"{param}.tool_calls")
    if tool_calls and role != "assistant":
        raise bad_request(
            f"{param}: only assistant messages have tool_calls", f"{param}.tool_calls"
        )
    content = _content(obj.get("content"), f"{param}.content", nullable=bool(tool_calls))
    tool_call_id = obj.get("tool_call_id")
    if role == "tool" and not isinstance(tool_call_id, str):
        raise bad_request(
            f"{param}.tool_call_id is required for tool messages", f"{param}.tool_call_id"
        )
    return ChatMessage(role, content, tool_calls, tool_call_id if role == "tool" else None)


def parse_tools(value: Any) -> tuple[ToolSpec, ...]:
    """Validate ``tools`` (function tools only, unique names)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad_request("tools must be a list", "tools")
    tools: list[ToolSpec] = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise bad_request(f"{where}: only {{'type': 'function'}} tools are supported", where)
        function = tool.get("function")
        if not isinstance(function, dict):
            raise bad_request(f"{where}.function must be an object", f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise bad_request(
                f"{where}.function.name must match {TOOL_NAME.pattern}, got {name!r}",
                f"{where}.function.name",
            )
        if any(t.name == name for t in tools):
            raise bad_request(f"{where}: duplicate tool name {name!r}", f"{where}.function.name")
        description = function.get("description", "")
        if not isinstance(description, str):
            raise bad_request(
                f"{where}.function.description must be a string", f"{where}.function.description"
            )
        parameters = function.get("parameters", {})
        if not isinstance(parameters, dict):
            raise bad_request(
                f"{where}.function.parameters must be an object", f"{where}.function.parameters"
            )
        tools.append(ToolSpec(name, description, parameters))
    return tuple(tools)


def _optional_int(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value) or value < minimum:
        raise bad_request(f"{name} must be an integer >= {minimum}, got {value!r}", name)
    return int(value)


def _include_usage(options: Any) -> bool:
    """``stream_options.include_usage`` (other stream options are ignored)."""
    if options is None:
        return False
    if not isinstance(options, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    value = options.get("include_usage", False)
    if value not in (None, False, True):
        raise bad_request(
            "stream_options.include_usage must be a boolean", "stream_options.include_usage"
        )
    return bool(value)


def parse_stop(value: Any) -> tuple[str, ...]:
    """Validate ``stop``: null, a string, or a list of non-empty strings."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > MAX_STOP_SEQUENCES:
        raise bad_request(
            f"stop must be a string or a list of at most {MAX_STOP_SEQUENCES} strings", "stop"
        )
    for i, stop in enumerate(stops):
        where = "stop" if isinstance(value, str) else f"stop[{i}]"
        if not isinstance(stop, str) or not 1 <= len(stop) <= MAX_STOP_LENGTH:
            raise bad_request(
                f"{where} must be a string of 1 to {MAX_STOP_LENGTH} characters, got {stop!r}",
                where,
            )
    return tuple(dict.fromkeys(stops))


def parse_n(value: Any) -> int:
    """Validate ``n``: null (1) or an integer from 1 to :data:`MAX_CHOICES`."""
    if value is None:
        return 1
    if not _is_int(value) or not 1 <= value <= MAX_CHOICES:
        raise bad_request(
            f"n must be an integer from 1 to {MAX_CHOICES}, got {value!r} (each choice is "
            "sampled; for more samples of one task run more rollouts)",
            "n",
        )
    return int(value)


TOOL_CHOICES = ("auto", "none", "required")
"""The string values of ``tool_choice``."""


def parse_tool_choice(value: Any, tools: tuple[ToolSpec, ...]) -> tuple[str, str | None]:
    """Validate ``tool_choice`` against the request's ``tools``: ``(mode, name)``, the
    mode ``"auto"`` (also for null), ``"none"`` or ``"required"``, and the name of the
    function it names (``{"type": "function", "function": {"name": ...}}``, read as
    ``"required"``), else ``None``. Forcing a call needs ``tools`` in the request, as
    the OpenAI API says; a named function must be one of them."""
    if value is None:
        return "auto", None
    if isinstance(value, str):
        if value not in TOOL_CHOICES:
            raise bad_request(
                f"tool_choice must be one of {list(TOOL_CHOICES)} or "
                f"{{'type': 'function', 'function': {{'name': ...}}}}, got {value!r}",
                "tool_choice",
            )
        if value == "required" and not tools:
            raise bad_request("tool_choice 'required' needs tools in the request", "tool_choice")
        return value, None
    if not isinstance(value, dict) or value.get("type") != "function":
        raise bad_request(
            "tool_choice must be a string or {'type': 'function', 'function': {'name': ...}}",
            "tool_choice.type" if isinstance(value, dict) else "tool_choice",
        )
    function = value.get("function")
    if not isinstance(function, dict):
        raise bad_request("tool_choice.function must be an object", "tool_choice.function")
    name = function.get("name")
    names = [t.name for t in tools]
    if not isinstance(name, str) or name not in names:
        listing = ", ".join(names) if names else "no tools were given"
        raise bad_request(
            f"tool_choice.function.name must name one of tools ({listing}), got {name!r}",
            "tool_choice.function.name",
        )
    return "required", name


def _check_unsupported(body: dict[str, Any]) -> None:
    """Refuse options that would make the recorded log-probs lie (see module doc)."""
    for name, default in _REFUSED_UNLESS_DEFAULT.items():
        value = body.get(name)
        if value is None or value == default or value in ([], {}):
            continue
        raise bad_request(f"{name}={value!r} is not supported by this gateway", name)
    if body.get("top_logprobs") not in (None, 0):
        raise bad_request("top_logprobs is not supported (use logprobs=true)", "top_logprobs")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise bad_request("only response_format {'type': 'text'} is supported", "response_format")


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a decoded ``/v1/chat/completions`` JSON body."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {_typename(body)}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model is required (a string)", "model")
    if len(model) > MAX_MODEL_LENGTH or not model.isprintable():
        raise bad_request(
            f"model must be at most {MAX_MODEL_LENGTH} printable characters (it names the role)",
            "model",
        )
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise bad_request("messages is required (a non-empty list)", "messages")
    messages = tuple(parse_message(m, i) for i, m in enumerate(raw_messages))

    _check_unsupported(body)
    stream = body.get("stream")
    if stream not in (None, False, True):
        raise bad_request("stream must be a boolean", "stream")
    include_usage = _include_usage(body.get("stream_options"))
    logprobs = body.get("logprobs")
    if logprobs not in (None, False, True):
        raise bad_request("logprobs must be a boolean", "logprobs")
    temperature = body.get("temperature")
    if temperature is not None and (not is_finite_number(temperature) or not 0 <= temperature <= 2):
        raise bad_request(
            f"temperature must be a number in [0, 2], got {temperature!r}", "temperature"
        )
    max_tokens = _optional_int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _optional_int(body, "max_tokens", 1)
    seed = _optional_int(body, "seed", -(2**63))
    if seed is not None and seed >= 2**63:
        raise bad_request(f"seed must fit in 64 bits, got {seed}", "seed")

    tools = parse_tools(body.get("tools"))
    tool_choice, forced_function = parse_tool_choice(body.get("tool_choice"), tools)
    parallel_tool_calls = body.get("parallel_tool_calls")
    if parallel_tool_calls not in (None, False, True):
        raise bad_request("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    return ChatRequest(
        model=model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        forced_function=forced_function,
        parallel_tool_calls=parallel_tool_calls is not False,
        temperature=None if temperature is None else float(temperature),
        max_tokens=max_tokens,
        seed=seed,
        stop=parse_stop(body.get("stop")),
        n=parse_n(body.get("n")),
        logprobs=bool(logprobs),
        stream=bool(stream),
        include_usage=include_usage,
    )
