"""Tool calls split from model replies (Hermes/Qwen `<tool_call>` blocks) and the linear-time reader of
Python-literal bodies that replaced `ast.literal_eval`."""

from __future__ import annotations

import ast
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlctl.trajectories import literals
from rlctl.trajectories.literals import MAX_LITERAL_CHARS, MAX_LITERAL_DEPTH, LiteralError, loads_lenient
from rlctl.trajectories.tool_calls import ParsedToolCall, split_tool_calls

scalars = st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.text(max_size=8)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=16,
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(values)
def test_python_reprs_read_as_ast_literal_eval_reads_them(value: object) -> None:
    text = repr(value)
    assert loads_lenient(text) == ast.literal_eval(text)
    assert loads_lenient(json.dumps(value)) == value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{'a': 1, 'b': [1, 2,],}", {"a": 1, "b": [1, 2]}),
        ("{'ok': True, 'no': False, 'nil': None}", {"ok": True, "no": False, "nil": None}),
        ("(1, 'x')", [1, "x"]),
        ("(1,)", [1]),
        ("['it\\'s', \"say \\\"hi\\\"\", '\\n\\t\\x41\\u00e9\\101']", ["it's", 'say "hi"', "\n\tAé" + "A"]),
        ("{'path': 'C:\\\\dir', 'unknown': '\\d'}", {"path": "C:\\dir", "unknown": "\\d"}),
        ("[-1, 2.5, 1e3, +0]", None),  # `+0` is not JSON: refused rather than guessed
        ("{'a': 'é', \"b\": '\"'}", {"a": "é", "b": '"'}),
        ("{'a': true, 'b': null}", {"a": True, "b": None}),
    ],
)
def test_lenient_bodies(text: str, expected: object) -> None:
    if expected is None:
        with pytest.raises(LiteralError):
            loads_lenient(text)
    else:
        assert loads_lenient(text) == expected


@pytest.mark.parametrize(
    "text",
    ["os.system('x')", "__import__('os')", "{'a': b}", "'unclosed", "[1, 2", "{1: 2}", "1 + 2", "lambda: 0", "",
     "{'a': 1} {'b': 2}", "'\\U00110000'"],
)  # fmt: skip
def test_what_is_not_a_literal_is_refused(text: str) -> None:
    with pytest.raises(LiteralError):
        loads_lenient(text)


def test_the_caps_refuse_rather_than_parse() -> None:
    body = "[" + "'x', " * (MAX_LITERAL_CHARS // 5) + "]"
    assert len(body) > MAX_LITERAL_CHARS
    with pytest.raises(LiteralError, match="over"):
        loads_lenient(body)
    assert len(loads_lenient(body, max_chars=None)) == MAX_LITERAL_CHARS // 5  # the cap, not the reader, refused
    deep = "[" * (MAX_LITERAL_DEPTH + 1) + "'x'" + "]" * (MAX_LITERAL_DEPTH + 1)
    with pytest.raises(LiteralError, match="deeper"):
        loads_lenient(deep)
    fits = "[" * MAX_LITERAL_DEPTH + "'x'" + "]" * MAX_LITERAL_DEPTH
    assert loads_lenient(fits) is not None
    with pytest.raises(LiteralError):  # JSON nested past the interpreter's recursion limit
        loads_lenient("[" * 100_000)


def test_an_unclosed_quote_costs_one_scan() -> None:
    # A backtracking string pattern would retry from every backslash; the possessive one fails once.
    with pytest.raises(LiteralError):
        literals.to_json("'" + "\\a" * 30_000)


def test_a_hermes_reply_splits_into_content_and_calls() -> None:
    reply = (
        "Let me look.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        "<tool_call>\n{'name': 'add', 'arguments': {'a': 1, 'b': 2,}}\n</tool_call>"
    )
    parsed = split_tool_calls(reply)
    assert parsed.content == "Let me look."
    assert parsed.tool_calls == [
        ParsedToolCall("get_weather", {"city": "Paris"}),
        ParsedToolCall("add", {"a": 1, "b": 2}),
    ]
    assert json.loads(parsed.tool_calls[1].arguments_json()) == {"a": 1, "b": 2}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"name": "f", "arguments": "{\\"x\\": 1}"}', ParsedToolCall("f", {"x": 1})),  # arguments as JSON text
        ('{"name": "f", "parameters": {"x": 1}}', ParsedToolCall("f", {"x": 1})),
        ('{"name": "f"}', ParsedToolCall("f", {})),
        ('{"name": "f", "arguments": null, "id": "c1"}', ParsedToolCall("f", {}, id="c1")),
    ],
)
def test_call_bodies(body: str, expected: ParsedToolCall) -> None:
    assert split_tool_calls(f"<tool_call>{body}</tool_call>").tool_calls == [expected]


@pytest.mark.parametrize(
    "body",
    ["not json", '{"arguments": {}}', '{"name": ""}', '{"name": 3}', '["f"]', '{"name": "f", "arguments": [1]}',
     '{"name": "f", "arguments": "not json"}', "{'name': 'f', 'arguments': {'x': os.getcwd()}}"],
)  # fmt: skip
def test_malformed_calls_stay_in_the_content(body: str) -> None:
    reply = f"Before <tool_call>{body}</tool_call> after"
    parsed = split_tool_calls(reply)
    assert parsed.tool_calls == []
    assert parsed.content == reply


def test_an_unclosed_call_and_plain_text_are_content() -> None:
    assert split_tool_calls("  hello  ") == split_tool_calls("hello")
    assert split_tool_calls("hello").tool_calls == []
    cut = 'Calling <tool_call>{"name": "f", "argu'
    assert split_tool_calls(cut).content == cut
    mixed = 'a <tool_call>bad</tool_call> b <tool_call>{"name": "g"}</tool_call> c'
    parsed = split_tool_calls(mixed)
    assert parsed.content == "a <tool_call>bad</tool_call> b c"
    assert parsed.tool_calls == [ParsedToolCall("g", {})]
