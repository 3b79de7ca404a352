"""Tool-call formats, their parser, and a tool registry with timeouts.

An agent response is parsed into exactly one action:

* :class:`ToolCall` ``(name, argument)``: run a tool on a string argument;
* :class:`FinalAnswer` ``(text)``: end the episode with an answer;
* :class:`Malformed` ``(reason)``: anything else, with a human-readable reason the
  environment shows back to the agent. Parsing never raises.

Two formats, chosen by name (:data:`FORMATS`):

``"tags"`` (default)
    Compact enough for a tiny character-level model. ``<call>ARG</call>`` calls
    the environment's default tool, ``<call>name: ARG</call>`` a named one, and
    ``<answer>TEXT</answer>`` answers.
``"hermes"``
    What instruction-tuned models (Qwen, Hermes) emit:
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, parsed with
    :mod:`json` (never ``eval``), and ``<answer>TEXT</answer>``.

Rules shared by both formats: free text *before* the action block is allowed
(reasoning), text *after* it is not; exactly one block; tags do not nest.

Tools take one string and return a string. :meth:`ToolRegistry.execute` runs
them in a daemon worker thread with a timeout, and turns exceptions and
timeouts into an error observation instead of crashing the rollout. (A timed-out
thread cannot be killed in Python; it is left to finish in the background, which
is why it is a daemon thread. Tools should bound their own work, as
:mod:`turnrl.envs.safe_math` does.)
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# ----------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class ToolCall:
    """A request to run tool ``name`` on ``argument``."""

    name: str
    argument: str


@dataclass(frozen=True)
class FinalAnswer:
    """The agent's final answer (the text between the answer tags, stripped)."""

    text: str


@dataclass(frozen=True)
class Malformed:
    """A response that is no valid action; ``reason`` says what was wrong."""

    reason: str


Action = ToolCall | FinalAnswer | Malformed

# ----------------------------------------------------------------------------- formats

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_TOOL_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_.-]*)\s*:(.*)", re.DOTALL)


@dataclass(frozen=True)
class ToolFormat:
    """How tool calls look in one format: the call tags and how a call body parses."""

    name: str
    call_open: str
    call_close: str


FORMATS: dict[str, ToolFormat] = {
    "tags": ToolFormat("tags", "<call>", "</call>"),
    "hermes": ToolFormat("hermes", "<tool_call>", "</tool_call>"),
}


def get_format(fmt: str) -> ToolFormat:
    """Look a format up by name; unknown names raise ``ValueError`` listing the known ones."""
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown tool format {fmt!r}; known: {sorted(FORMATS)}") from None


def format_call(fmt: str, name: str, argument: str, *, parameter: str = "input") -> str:
    """Render a tool call as the agent should write it.

    In ``"tags"`` format, pass ``name=""`` for the bare default-tool form
    ``<call>ARG</call>``. In ``"hermes"`` format ``parameter`` names the argument.
    """
    spec = get_format(fmt)
    if spec.name == "hermes":
        body = json.dumps({"name": name, "arguments": {parameter: argument}})
    else:
        body = f"{name}: {argument}" if name else argument
    return f"{spec.call_open}{body}{spec.call_close}"


def format_answer(text: str) -> str:
    """Render a final answer (same in every format)."""
    return f"{ANSWER_OPEN}{text}{ANSWER_CLOSE}"


# ----------------------------------------------------------------------------- parser


def _find_block(text: str, spec: ToolFormat) -> tuple[str, str] | Malformed:
    """Find the single action block: ``("call"|"answer", body)`` or a Malformed."""
    kinds = {
        spec.call_open: "call",
        spec.call_close: "call",
        ANSWER_OPEN: "answer",
        ANSWER_CLOSE: "answer",
    }
    opening = {spec.call_open, ANSWER_OPEN}
    pattern = re.compile("|".join(re.escape(t) for t in sorted(kinds, key=len, reverse=True)))

    blocks: list[tuple[str, str]] = []
    inside: str | None = None  # the opening tag we are inside of
    body_start = last_end = 0
    for match in pattern.finditer(text):
        tag = match.group()
        if tag in opening:
            if inside is not None:
                return Malformed(f"{tag} inside an unclosed {inside}")
            inside, body_start = tag, match.end()
        else:
            if inside is None or kinds[inside] != kinds[tag]:
                return Malformed(f"unexpected {tag} without a matching opening tag")
            blocks.append((kinds[tag], text[body_start : match.start()]))
            inside, last_end = None, match.end()
    if inside is not None:
        return Malformed(f"unclosed {inside} tag")
    if not blocks:
        return Malformed(f"no {spec.call_open} or {ANSWER_OPEN} found")
    if len({kind for kind, _ in blocks}) > 1:
        return Malformed("both a tool call and an answer; give exactly one")
    if len(blocks) > 1:
        return Malformed(f"{len(blocks)} {blocks[0][0]} blocks; give exactly one")
    trailing = text[last_end:].strip()
    if trailing:
        return Malformed(f"unexpected text after the closing tag: {trailing[:30]!r}")
    return blocks[0]


def _json_argument(arguments: object) -> str:
    """Flatten hermes ``arguments`` to the tool's single string argument.

    A dict with one entry gives that value (strings as-is, other JSON values
    serialised); a string is taken as-is; anything else is serialised JSON.
    """
    if isinstance(arguments, dict) and len(arguments) == 1:
        arguments = next(iter(arguments.values()))
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, sort_keys=True)


def _parse_call_body(body: str, spec: ToolFormat, default_tool: str | None) -> Action:
    """Turn the text inside the call tags into a ToolCall (tool name unchecked)."""
    if spec.name == "hermes":
        try:
            obj = json.loads(body)
        except (json.JSONDecodeError, RecursionError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            return Malformed(f"invalid JSON in {spec.call_open}: {reason}")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return Malformed(f'{spec.call_open} JSON needs a string "name"')
        return ToolCall(obj["name"], _json_argument(obj.get("arguments", {})))
    named = _TOOL_NAME.fullmatch(body.strip())
    if named:
        return ToolCall(named.group(1), named.group(2).strip())
    if default_tool is None:
        return Malformed(f"no tool name; write {spec.call_open}name: ARG{spec.call_close}")
    return ToolCall(default_tool, body.strip())


def parse_response(
    text: str,
    fmt: str = "tags",
    *,
    tool_names: Iterable[str] | None = None,
    default_tool: str | None = None,
) -> Action:
    """Parse one agent response into a ToolCall, FinalAnswer or Malformed.

    ``tool_names``: the tools that exist (``None``: accept any name).
    ``default_tool``: the tool a bare ``<call>ARG</call>`` means (tags format).
    Never raises on any ``text``; an unknown ``fmt`` raises ``ValueError``.
    """
    spec = get_format(fmt)
    if not isinstance(text, str) or not text.strip():
        return Malformed("empty response")
    found = _find_block(text, spec)
    if isinstance(found, Malformed):
        return found
    kind, body = found
    if kind == "answer":
        answer = body.strip()
        return FinalAnswer(answer) if answer else Malformed(f"empty {ANSWER_OPEN}")
    if not body.strip():
        return Malformed(f"empty {spec.call_open}")
    action = _parse_call_body(body, spec, default_tool)
    if isinstance(action, ToolCall) and tool_names is not None:
        known = sorted(tool_names)
        if action.name not in known:
            listing = ", ".join(known) if known else "none"
            return Malformed(f"unknown tool {action.name[:30]!r}; tools: {listing}")
    return action


# ----------------------------------------------------------------------------- tools


@dataclass(frozen=True)
class Tool:
    """A tool: ``fn`` maps one string argument to a string result.

    ``parameter`` names the argument in JSON-style formats (``"hermes"``).
    """

    name: str
    description: str
    fn: Callable[[str], str]
    timeout_s: float = 2.0
    parameter: str = "input"


@dataclass(frozen=True)
class ToolResult:
    """What running a tool produced: the observation text, and the error if it failed."""

    output: str
    error: str | None = None


def run_with_timeout(fn: Callable[[str], str], argument: str, timeout_s: float) -> ToolResult:
    """Run ``fn(argument)`` in a daemon thread; errors and timeouts become a ToolResult."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn(argument)
        except BaseException as exc:  # a tool must never take the rollout down
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True, name="turnrl-tool")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        error = f"timed out after {timeout_s:g} s"
    elif "error" in box:
        exc = box["error"]
        error = str(exc) or type(exc).__name__
    else:
        return ToolResult(str(box.get("value", "")))
    return ToolResult(f"error: {error}", error)


class ToolRegistry:
    """The tools available in an environment, by name, with an optional default tool."""

    def __init__(self, tools: Iterable[Tool], default: str | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise ValueError(f"duplicate tool name {tool.name!r}")
            self._tools[tool.name] = tool
        if default is not None and default not in self._tools:
            raise ValueError(f"default tool {default!r} is not registered: {sorted(self._tools)}")
        self.default = default

    @property
    def names(self) -> tuple[str, ...]:
        """Names of the registered tools, in registration order."""
        return tuple(self._tools)

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def parse(self, text: str, fmt: str = "tags") -> Action:
        """Parse a response against these tools (see :func:`parse_response`)."""
        return parse_response(text, fmt, tool_names=self._tools, default_tool=self.default)

    def execute(self, call: ToolCall) -> ToolResult:
        """Run a call with its tool's timeout; an unknown tool gives an error result."""
        tool = self._tools.get(call.name)
        if tool is None:
            error = f"unknown tool {call.name!r}"
            return ToolResult(f"error: {error}", error)
        return run_with_timeout(tool.fn, call.argument, tool.timeout_s)

    def format_call(self, fmt: str, name: str, argument: str) -> str:
        """Render a call to ``name`` (bare form for the default tool in tags format)."""
        bare = fmt == "tags" and name == self.default
        return format_call(fmt, "" if bare else name, argument, parameter=self[name].parameter)

    def describe(self, fmt: str) -> str:
        """Short instructions for a system prompt: how to call each tool and answer."""
        spec = get_format(fmt)
        lines = []
        for tool in self._tools.values():
            example = self.format_call(fmt, tool.name, tool.parameter.upper())
            lines.append(f"{example} {tool.description}")
        lines.append(f"{format_answer('TEXT')} final answer.")
        if spec.name == "hermes":
            lines.insert(0, "Call a tool or answer; one action per reply.")
        return "\n".join(lines)
