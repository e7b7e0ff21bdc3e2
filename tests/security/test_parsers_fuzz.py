"""Bounded fuzzing of the parsers of untrusted text: the linear-time tag scanner agrees with the regular
expressions it replaced (on inputs small enough for them), and no input makes a parser raise or hang."""

from __future__ import annotations

import contextlib
import io
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlctl.service.datasets.uploads import upload_items
from rlctl.trajectories import literals, tags
from rlctl.trajectories.reading import ItemError, ItemTooLarge, RawItem, read_items
from rlctl.trajectories.tool_calls import split_tool_calls

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
FRAGMENTS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tools>",
             "</tools>", "<thinking>", "</thinking>", '{"name": "t", "arguments": {}}', "[", "]", "{", "}", '"', "x",
             " ", "\n", "<", ">", "/"]  # fmt: skip
tagged_text = st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join)

# The regular expressions of the former parser: the reference (quadratic on hostile input, fine on these).
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_TOOL_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.DOTALL)
_TOOLS = re.compile(r"<tools>((?:(?!<tools>).)*?)</tools>", re.DOTALL)
_SPACED_CALL = re.compile(r"\s*<tool_call>.*?</tool_call>", re.DOTALL)
_UNCLOSED_THINK = re.compile(r"<think>.*\Z", re.DOTALL)


def _reference_visible(text: str) -> str:
    for pattern in (_THINK, _TOOL_CALL, _TOOL_RESPONSE):
        text = pattern.sub("", text)
    return _UNCLOSED_THINK.sub("", text).strip()


@FUZZ
@given(tagged_text)
def test_the_scanner_agrees_with_the_former_regular_expressions(text: str) -> None:
    bodies = [text[start:end] for _, start, end, _ in tags.blocks(text, "<tool_call>", "</tool_call>")]
    assert bodies == _TOOL_CALL.findall(text)
    innermost = [text[start:end] for _, start, end, _ in tags.blocks(text, "<tools>", "</tools>", innermost=True)]
    assert innermost == _TOOLS.findall(text)
    assert tags.has_reasoning(text) == any(block.strip() for block in _THINK.findall(text))
    assert tags.visible_text(text) == _reference_visible(text)
    assert tags.without_tool_calls(text) == _SPACED_CALL.sub("", text)
    expected = text
    for tag in tags.SCRATCHPAD_TAGS:
        scratchpad = re.compile(rf"<{tag}>(.*?)</{tag}>", re.DOTALL)
        expected = scratchpad.sub(lambda m: tags.render_think(m.group(1)), expected)
    assert tags.normalize_scratchpad(text) == expected


@FUZZ
@given(tagged_text)
def test_tag_parsers_return_values_for_any_text(text: str) -> None:
    for call in tags.parse_tagged_tool_calls(text):
        assert isinstance(call["name"], str)
    response = tags.parse_tagged_tool_response(text)
    assert response is None or isinstance(response, dict)
    names = tags.tool_names_in_tools_block(text)
    assert names is None or all(isinstance(name, str) for name in names)


def test_a_megabyte_of_hostile_tags_is_parsed_in_one_pass() -> None:
    # Each of these took the former parser minutes (quadratic backtracking); a linear scan takes milliseconds.
    megabyte = 1 << 20
    for tag in ("<tool_call>", "<think>", "<tool_response>", "<tools>", "<thinking>"):
        text = tag * (megabyte // len(tag))
        assert tags.parse_tagged_tool_calls(text) == []
        assert tags.visible_text(text) in ("", text.strip())
        tags.has_reasoning(text), tags.tool_names_in_tools_block(text), tags.normalize_scratchpad(text)
        tags.parse_tagged_tool_response(text), tags.without_tool_calls(text)
    nested = "<tool_call>" + "[" * 200_000 + "</tool_call>"
    assert tags.parse_tagged_tool_calls(nested) == []  # too deep for JSON and Python: skipped, not raised


LITERAL_FRAGMENTS = ["'", '"', "\\", "[", "]", "{", "}", "(", ")", ",", ":", " ", "1", "-", "e", ".", "True", "None",
                     "x", "\\x4", "\\u00", "<tool_call>", "</tool_call>", '{"name": "f"', "'arguments': "]  # fmt: skip
literal_text = st.lists(st.sampled_from(LITERAL_FRAGMENTS), max_size=40).map("".join)


@FUZZ
@given(literal_text | st.text(max_size=200))
def test_the_literal_reader_and_the_call_splitter_never_raise_anything_else(text: str) -> None:
    with contextlib.suppress(literals.LiteralError):
        literals.loads_lenient(text)
    parsed = split_tool_calls(text)
    assert all(isinstance(call.name, str) and isinstance(call.arguments, dict) for call in parsed.tool_calls)
    assert len(parsed.content) <= len(text)


def test_hostile_literal_bodies_are_refused_or_read_in_one_pass() -> None:
    # ast.literal_eval held the interpreter ~2 s and ~900 MB on a MiB of these; the reader is linear and capped.
    cap = literals.MAX_LITERAL_CHARS
    for body in ("['x', " * (cap // 6), "(" * cap, "'" + "\\'" * (cap // 2), "{'a': " * (cap // 6), "1," * (cap // 2)):
        for text in (body, f"<tool_call>{body}</tool_call>"):
            with contextlib.suppress(literals.LiteralError):
                literals.loads_lenient(text)
            assert split_tool_calls(text).tool_calls == []
    too_big = "[" + "'x'," * cap + "]"
    assert tags.parse_tagged_tool_calls(f"<tool_call>{{'name': 'f', 'arguments': {too_big}}}</tool_call>") == []


@FUZZ
@given(st.binary(max_size=2000))
def test_uploads_of_any_bytes_give_items_or_item_errors(data: bytes) -> None:
    for container in ("auto", "jsonl", "json"):
        try:
            for item in upload_items(io.BytesIO(data), container):  # type: ignore[arg-type]
                assert isinstance(item, RawItem | ItemError)
        except ValueError as error:  # undecodable bytes: the one refusal of a whole upload (by line)
            assert "line" in str(error) and not isinstance(error, ItemTooLarge)


@FUZZ
@given(st.lists(st.text(max_size=80), max_size=8))
def test_text_lines_of_any_kind_give_items_or_item_errors(lines: list[str]) -> None:
    for container in ("auto", "jsonl", "json"):
        for item in read_items(lines, container):
            assert isinstance(item, RawItem | ItemError)


def test_the_gsm8k_scorer_reads_hostile_completions_in_one_pass() -> None:
    from environments.gsm8k import extract_answer

    megabyte = 1 << 20
    assert extract_answer("<think>" * (megabyte // 7)) is None  # unclosed reasoning: no answer yet
    assert extract_answer("answer is" + "\t" * megabyte + "x 7") == "7"
    assert extract_answer("<think>a</think>" * (megabyte // 16) + "#### 12") == "12"
