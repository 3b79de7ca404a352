"""Tool-call parser, safe arithmetic and tool execution (turnrl.envs.tools / safe_math)."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnrl.envs.safe_math import SafeMathError, calculate, evaluate, format_number
from turnrl.envs.tools import (
    FinalAnswer,
    Malformed,
    Tool,
    ToolCall,
    ToolRegistry,
    format_answer,
    format_call,
    parse_response,
    run_with_timeout,
)

TOOLS = ("calculator", "search")


def tags(text: str) -> object:
    return parse_response(text, "tags", tool_names=TOOLS, default_tool="calculator")


def hermes(text: str) -> object:
    return parse_response(text, "hermes", tool_names=TOOLS)


# ----------------------------------------------------------------------------- tags format


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<call>347*812</call>", ToolCall("calculator", "347*812")),
        ("  <call> 3 + 4 </call>\n", ToolCall("calculator", "3 + 4")),
        ("<call>search: capital of France</call>", ToolCall("search", "capital of France")),
        ("<call>calculator:1+1</call>", ToolCall("calculator", "1+1")),
        ("<answer>281764</answer>", FinalAnswer("281764")),
        ("I think... <answer> 7 </answer>", FinalAnswer("7")),
    ],
)
def test_tags_valid(text: str, expected: object) -> None:
    assert tags(text) == expected


@pytest.mark.parametrize(
    ("text", "reason_part"),
    [
        ("", "empty response"),
        ("   \n", "empty response"),
        ("7", "no <call> or <answer> found"),
        ("<call>3+4", "unclosed <call>"),
        ("<answer>7", "unclosed <answer>"),
        ("3+4</call>", "unexpected </call>"),
        ("<call>3+4</answer>", "unexpected </answer>"),
        ("<call>3+4</call><answer>7</answer>", "both a tool call and an answer"),
        ("<call>1</call><call>2</call>", "2 call blocks"),
        ("<call><answer>1</answer></call>", "<answer> inside an unclosed <call>"),
        ("<call>weather: Paris</call>", "unknown tool 'weather'"),
        ("<call>  </call>", "empty <call>"),
        ("<answer></answer>", "empty <answer>"),
        ("<answer>7</answer> and more", "unexpected text after the closing tag"),
    ],
)
def test_tags_malformed(text: str, reason_part: str) -> None:
    action = tags(text)
    assert isinstance(action, Malformed)
    assert reason_part in action.reason


def test_tags_bare_call_without_default_tool_is_malformed() -> None:
    action = parse_response("<call>3+4</call>", "tags", tool_names=TOOLS)
    assert isinstance(action, Malformed)
    assert "no tool name" in action.reason


def test_unknown_tool_names_accepted_when_no_list_given() -> None:
    assert parse_response("<call>x: y</call>") == ToolCall("x", "y")


def test_unknown_format_raises() -> None:
    with pytest.raises(ValueError, match="known: \\['hermes', 'tags'\\]"):
        parse_response("<answer>1</answer>", "xml")


# ----------------------------------------------------------------------------- hermes format


def test_hermes_valid() -> None:
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'
    assert hermes("Let me compute.\n" + call) == ToolCall("calculator", "2*3")
    assert hermes("<answer>6</answer>") == FinalAnswer("6")


def test_hermes_argument_flattening() -> None:
    two = '<tool_call>{"name": "search", "arguments": {"q": "a", "k": 3}}</tool_call>'
    assert hermes(two) == ToolCall("search", json.dumps({"k": 3, "q": "a"}, sort_keys=True))
    as_string = '<tool_call>{"name": "search", "arguments": "raw"}</tool_call>'
    assert hermes(as_string) == ToolCall("search", "raw")
    number = '<tool_call>{"name": "search", "arguments": {"k": 3}}</tool_call>'
    assert hermes(number) == ToolCall("search", "3")


@pytest.mark.parametrize(
    ("text", "reason_part"),
    [
        ("<tool_call>{name: calculator}</tool_call>", "invalid JSON"),
        ("<tool_call>[1, 2]</tool_call>", 'needs a string "name"'),
        ('<tool_call>{"arguments": {}}</tool_call>', 'needs a string "name"'),
        ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', "unknown tool 'rm'"),
        ('<tool_call>{"name": "search"}', "unclosed <tool_call>"),
        ("<call>3+4</call>", "no <tool_call> or <answer> found"),
    ],
)
def test_hermes_malformed(text: str, reason_part: str) -> None:
    action = hermes(text)
    assert isinstance(action, Malformed)
    assert reason_part in action.reason


def test_format_call_round_trips() -> None:
    for fmt, name in [("tags", "search"), ("hermes", "search"), ("hermes", "calculator")]:
        text = format_call(fmt, name, "1+2", parameter="expression")
        assert parse_response(text, fmt, tool_names=TOOLS) == ToolCall(name, "1+2")
    assert format_call("tags", "", "1+2") == "<call>1+2</call>"
    assert parse_response(format_answer("x"), "hermes") == FinalAnswer("x")


PARSER_PIECES = [*'<>/{}":, ab1+', "<call>", "</call>", "<answer>", "</answer>"]
PARSER_PIECES += ["<tool_call>", "</tool_call>", '{"name": "search"', "calculator:", "\n"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(PARSER_PIECES), max_size=12).map("".join) | st.text(max_size=60),
    st.sampled_from(["tags", "hermes"]),
)
def test_parser_never_raises(text: str, fmt: str) -> None:
    action = parse_response(text, fmt, tool_names=TOOLS, default_tool="calculator")
    assert isinstance(action, ToolCall | FinalAnswer | Malformed)
    if isinstance(action, Malformed):
        assert action.reason


# ----------------------------------------------------------------------------- safe math


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("12/4", "3"),
        ("7/2", "3.5"),
        ("347*812", "281764"),
        ("-(2+3)*4", "-20"),
        ("17//5", "3"),
        ("17%5", "2"),
        ("2**10", "1024"),
        ("2**-2", "0.25"),
        ("1/3", "0.333333333333"),
        ("0.1+0.2", "0.3"),
        ("123456789*987654321", "121932631112635269"),
    ],
)
def test_safe_math_accepts(expr: str, expected: str) -> None:
    assert calculate(expr) == expected


@pytest.mark.parametrize(
    ("expr", "reason_part"),
    [
        ("__import__('os')", "unsupported syntax: Call"),
        ("x+1", "unsupported syntax: Name"),
        ("(1).__class__", "unsupported syntax: Attribute"),
        ("'a'*3", "unsupported literal"),
        ("True+1", "unsupported literal"),
        ("1j", "unsupported literal"),
        ("1<2", "unsupported syntax: Compare"),
        ("1<<2", "unsupported operator LShift"),
        ("~1", "unsupported operator Invert"),
        ("9**9**9", "exponent too large"),
        ("2**0.5", "exponent must be an integer"),
        ("10**31", "number too large"),
        ("1e300*1e300", "number too large"),
        ("1/0", "division by zero"),
        ("1%0", "modulo by zero"),
        ("0**-1", "division by zero"),
        ("", "empty expression"),
        ("1+" * 150 + "1", "too long"),
        ("1 +", "invalid expression"),
        ("[1, 2]", "unsupported syntax: List"),
    ],
)
def test_safe_math_rejects(expr: str, reason_part: str) -> None:
    with pytest.raises(SafeMathError, match=None) as info:
        evaluate(expr)
    assert reason_part in str(info.value)


def test_integers_stay_exact() -> None:
    assert evaluate("(10**20+1)-10**20") == 1
    assert isinstance(evaluate("12/4"), int)


def test_format_number() -> None:
    assert format_number(3) == "3"
    assert format_number(3.0) == "3"
    assert format_number(-0.0) == "0"
    assert format_number(3.5) == "3.5"


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list("0123456789+-*/%().e_ jTrue'")), max_size=40) | st.text()
)
def test_safe_math_raises_only_its_own_error(expr: str) -> None:
    try:
        value = evaluate(expr)
    except SafeMathError as exc:
        assert str(exc)
    else:
        assert type(value) in (int, float)


# ----------------------------------------------------------------------------- execution


def test_registry_executes_and_reports_errors() -> None:
    def boom(_: str) -> str:
        raise RuntimeError("kaput")

    registry = ToolRegistry(
        [Tool("calculator", "math", calculate), Tool("boom", "fails", boom)], default="calculator"
    )
    assert registry.names == ("calculator", "boom")
    ok = registry.execute(ToolCall("calculator", "2+2"))
    assert (ok.output, ok.error) == ("4", None)
    bad = registry.execute(ToolCall("calculator", "1/0"))
    assert (bad.output, bad.error) == ("error: division by zero", "division by zero")
    raised = registry.execute(ToolCall("boom", ""))
    assert raised.error == "kaput"
    unknown = registry.execute(ToolCall("nope", ""))
    assert unknown.error == "unknown tool 'nope'"
    assert registry.parse("<call>2+2</call>") == ToolCall("calculator", "2+2")


def test_tool_timeout_gives_error_result() -> None:
    release = threading.Event()

    def hang(_: str) -> str:
        release.wait(30)
        return "late"

    result = run_with_timeout(hang, "", timeout_s=0.05)
    release.set()
    assert result.error == "timed out after 0.05 s"
    assert result.output.startswith("error: ")


def test_registry_rejects_bad_configuration() -> None:
    tool = Tool("calculator", "math", calculate)
    with pytest.raises(ValueError, match="duplicate"):
        ToolRegistry([tool, tool])
    with pytest.raises(ValueError, match="default tool 'x'"):
        ToolRegistry([tool], default="x")
