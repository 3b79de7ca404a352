"""OpenAI tool calls <-> the policy's text tool-call formats.

The policy reads and writes plain text; OpenAI clients exchange structured
``tool_calls``. This module translates both ways, reusing the parsers of
:mod:`turnrl.envs.tools` (``"tags"``: ``<call>ARG</call>`` /
``<call>name: ARG</call>``; ``"hermes"``: ``<tool_call>{json}</tool_call>``).

Requests -> text:

* ``tools`` are described in the system prompt, one short line per tool,
  appended to the first system message (or as a new first system message)::

      <call>EXPRESSION</call> calculator: evaluates arithmetic          (tags, one tool)
      <call>search: QUERY</call> search: looks a word up                (tags, several tools)
      <call>lookup: {"a": "A", "b": "B"}</call> lookup: ...             (tags, several parameters)
      <tool_call>{"name": "calc", "arguments": {"expr": "EXPR"}}</tool_call> calc: ...  (hermes)

  In tags format the only tool of a request is the default tool, written bare.
* An assistant message's ``tool_calls`` become call blocks after its content;
  a single-parameter call ``{"expression": "1+2"}`` becomes ``<call>1+2</call>``.
* ``tool`` messages keep role ``tool`` and their content.

Text -> response: a sampled reply that parses as exactly one call to a known
tool (:func:`turnrl.envs.tools.parse_response`) becomes ``content`` (the text
before the call block, ``None`` if empty) plus one ``tool_call`` whose
``arguments`` is a JSON object string (single-parameter tools:
``{"<param>": ARG}``; several parameters: ARG as written, which should be a
JSON object). Any other reply, final answers included, is returned verbatim as
``content``.

Forced calls (``tool_choice`` ``"required"`` or a named function): the gateway writes
:func:`forced_call_prefix` after the generation prompt and the policy samples the
rest; the reply parsed is the prefix plus the sampled text. The prefix is the call
block up to where the arguments begin when the function is known (named, or the
request's only tool): ``<call>`` (tags, the only tool, bare), ``<call>name: `` (tags,
several tools), ``<tool_call>{"name": "calc", "arguments": `` (hermes). With several
tools and ``"required"`` only the opener (``<call>`` / ``<tool_call>``) is forced and
the policy samples the function's name too: choosing the function is the policy's
decision, and it is trained like any other sampled token.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from turnrl.envs.tools import ToolCall, format_call, get_format, parse_response
from turnrl.serve.jsonbody import loads_or_none
from turnrl.serve.protocol import ChatMessage, FunctionCall, ToolSpec
from turnrl.types import Message


def _find_tool(tools: Sequence[ToolSpec], name: str) -> ToolSpec | None:
    return next((t for t in tools if t.name == name), None)


def _default_tool(tools: Sequence[ToolSpec]) -> str | None:
    """The tool a bare ``<call>ARG</call>`` means: the request's only tool."""
    return tools[0].name if len(tools) == 1 else None


def _placeholder_arguments(tool: ToolSpec) -> dict[str, str]:
    names = tool.parameter_names or ("input",)
    return {name: name.upper() for name in names}


def _call_block(fmt: str, tools: Sequence[ToolSpec], name: str, arguments: Any) -> str:
    """One call written in ``fmt``; ``arguments`` is the decoded JSON (or a raw string)."""
    spec = get_format(fmt)
    if spec.name == "hermes":
        body = json.dumps({"name": name, "arguments": arguments})
        return f"{spec.call_open}{body}{spec.call_close}"
    tool = _find_tool(tools, name)
    primary = tool.primary_parameter if tool is not None else None
    if isinstance(arguments, dict) and primary is not None and set(arguments) == {primary}:
        value = arguments[primary]
        argument = value if isinstance(value, str) else json.dumps(value)
    else:
        argument = arguments if isinstance(arguments, str) else json.dumps(arguments)
    bare = name == _default_tool(tools)
    return format_call(fmt, "" if bare else name, argument)


def forced_call_prefix(tools: Sequence[ToolSpec], fmt: str, name: str | None) -> str:
    """The forced start of a call to ``name`` (``None``: any of ``tools``) in ``fmt``:
    every call block :func:`_call_block` writes for that function starts with it (see
    the module docstring)."""
    spec = get_format(fmt)
    if name is None and len(tools) == 1:
        name = tools[0].name
    if name is None:
        return spec.call_open
    if spec.name == "hermes":
        return f'{spec.call_open}{{"name": {json.dumps(name)}, "arguments": '
    return spec.call_open if name == _default_tool(tools) else f"{spec.call_open}{name}: "


def tools_prompt(tools: Sequence[ToolSpec], fmt: str) -> str:
    """The system-prompt lines that describe ``tools`` (see the module docstring)."""
    lines = []
    for tool in tools:
        placeholder = _placeholder_arguments(tool)
        example = _call_block(fmt, tools, tool.name, placeholder)
        about = f"{tool.name}: {tool.description}" if tool.description else tool.name
        lines.append(f"{example} {about}")
    return "\n".join(lines)


def message_text(message: ChatMessage, tools: Sequence[ToolSpec], fmt: str) -> str:
    """The text of a message as the policy sees it (tool calls written as blocks)."""
    calls = "".join(
        _call_block(fmt, tools, c.name, c.parsed if c.parsed is not None else c.arguments)
        for c in message.tool_calls
    )
    return (message.content or "") + calls


def to_policy_message(message: ChatMessage, tools: Sequence[ToolSpec], fmt: str) -> Message:
    """A request message as a turnrl chat message (``role`` and ``content`` only)."""
    return {"role": message.role, "content": message_text(message, tools, fmt)}


def to_policy_messages(
    messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], fmt: str, *, tools_in_prompt: bool
) -> list[Message]:
    """All request messages as turnrl messages, with ``tools`` (the conversation's
    tool set) described in the system prompt when ``tools_in_prompt``."""
    out = [to_policy_message(m, tools, fmt) for m in messages]
    if tools_in_prompt and tools:
        text = tools_prompt(tools, fmt)
        if out[0]["role"] == "system":
            first = out[0]["content"]
            out[0] = {"role": "system", "content": f"{first}\n{text}" if first else text}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


@dataclass(frozen=True)
class Reply:
    """A sampled response as an OpenAI assistant message."""

    content: str | None
    tool_calls: tuple[FunctionCall, ...] = ()

    def message(self) -> dict[str, Any]:
        """The OpenAI ``choices[0].message`` object."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls
            ]
        return out

    def as_chat_message(self) -> ChatMessage:
        """The reply as the client will echo it back in its next request."""
        return ChatMessage("assistant", self.content, self.tool_calls)


def _openai_arguments(call: ToolCall, text: str, tool: ToolSpec, fmt: str) -> str:
    """The ``arguments`` JSON string of a parsed call."""
    spec = get_format(fmt)
    if spec.name == "hermes":
        # Re-read the (already validated) JSON body to keep the argument object whole.
        start = text.index(spec.call_open) + len(spec.call_open)
        body = json.loads(text[start : text.index(spec.call_close, start)])
        arguments = body.get("arguments", {})
        return arguments if isinstance(arguments, str) else json.dumps(arguments)
    primary = tool.primary_parameter
    return json.dumps({primary: call.argument}) if primary is not None else call.argument


def parse_reply(text: str, tools: Sequence[ToolSpec], fmt: str, call_id: str) -> Reply:
    """Turn sampled text into content and at most one tool call (see module doc)."""
    if tools:
        action = parse_response(
            text, fmt, tool_names=[t.name for t in tools], default_tool=_default_tool(tools)
        )
        if isinstance(action, ToolCall):
            tool = _find_tool(tools, action.name)
            assert tool is not None  # parse_response checked the name
            arguments = _openai_arguments(action, text, tool, fmt)
            before = text[: text.index(get_format(fmt).call_open)]
            call = FunctionCall(call_id, action.name, arguments, loads_or_none(arguments))
            return Reply(before or None, (call,))
    return Reply(text)
