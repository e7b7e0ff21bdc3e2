"""Splitting input streams into items: JSON Lines and whole JSON documents, with line numbers."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.trajectories.reading import (
    ItemError,
    RawItem,
    is_message_like,
    read_items,
    read_json_document,
    read_jsonl,
)

json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=12)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
records = st.lists(st.dictionaries(st.text(max_size=8), json_values, min_size=1, max_size=5), max_size=6)


def chunked(text: str, sizes: list[int]) -> list[str]:
    chunks, position = [], 0
    for size in sizes:
        if position >= len(text):
            break
        chunks.append(text[position : position + size])
        position += size
    chunks.append(text[position:])
    return chunks


@settings(max_examples=150, deadline=None)
@given(records, st.sampled_from([None, 1, 2, 4]), st.lists(st.integers(1, 40), max_size=50))
def test_document_items_equal_the_parsed_array_whatever_the_chunking(items, indent, sizes) -> None:
    text = json.dumps(items, indent=indent)
    parsed = list(read_json_document(chunked(text, sizes)))
    bare_message_list = bool(items) and is_message_like(items[0])
    assert [p.value for p in parsed] == ([items] if bare_message_list else items)
    assert all(isinstance(p, RawItem) for p in parsed)


@settings(max_examples=100, deadline=None)
@given(records)
def test_document_item_lines_point_at_each_elements_opening_brace(items) -> None:
    text = json.dumps(items, indent=2)
    expected_lines = [number for number, line in enumerate(text.splitlines(), 1) if line.startswith("  {")]
    if items and is_message_like(items[0]):
        expected_lines = [1]  # a bare message list is one item, starting where the array starts
    assert [item.line for item in read_items(text.splitlines(keepends=True))] == expected_lines


def test_real_pretty_printed_array_items_start_at_their_lines(trajectories_dir: Path) -> None:
    path = trajectories_dir / "llamafactory-glaive-toolcall-en-demo.json"
    lines = path.read_text(encoding="utf-8").splitlines()
    opening_lines = [number for number, line in enumerate(lines, 1) if re.fullmatch(r"  \{", line)]
    with path.open(encoding="utf-8") as stream:
        items = list(read_items(stream))
    assert len(items) == 12
    assert [item.line for item in items] == opening_lines
    assert items[0].value == json.loads(path.read_text(encoding="utf-8"))[0]


def test_auto_reads_one_line_objects_as_json_lines_and_pretty_documents_as_one_document() -> None:
    jsonl = ['{"a": 1}\n', "\n", '{"b": 2}\n']
    assert [(i.line, i.value) for i in read_items(jsonl)] == [(1, {"a": 1}), (3, {"b": 2})]
    document = ["{\n", '  "a": [1, 2]\n', "}\n"]
    assert [(i.line, i.value) for i in read_items(document)] == [(1, {"a": [1, 2]})]


def test_lines_without_line_ends_are_accepted() -> None:
    text = json.dumps([{"x": 1}, {"y": "two"}], indent=2)
    assert [i.value for i in read_items(text.splitlines())] == [{"x": 1}, {"y": "two"}]


def test_a_bare_message_list_is_one_item() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert [i.value for i in read_items([json.dumps(messages, indent=2)])] == [messages]
    assert [i.value for i in read_items([json.dumps(messages)])] == [messages]


def test_a_json_lines_line_holding_an_array_of_records_gives_each_record() -> None:
    line = json.dumps([{"conversations": []}, {"conversations": []}])
    assert [(i.line, i.value) for i in read_items([line])] == [(1, {"conversations": []})] * 2


def test_bad_json_lines_are_reported_with_their_line_and_the_rest_still_read() -> None:
    lines = ['{"ok": 1}\n', '{"broken": \n', "\n", "[1, 2\n", '{"ok": 2}\n']
    outcomes = list(read_jsonl(lines))
    assert [o.line for o in outcomes] == [1, 2, 4, 5]
    assert [type(o) for o in outcomes] == [RawItem, ItemError, ItemError, RawItem]
    assert all(o.code == "INVALID_JSON" for o in outcomes if isinstance(o, ItemError))


def test_a_broken_first_json_lines_line_does_not_turn_the_file_into_one_document() -> None:
    outcomes = list(read_items(['{"a": 1,,}\n', '{"b": 2}\n']))
    assert isinstance(outcomes[0], ItemError) and outcomes[0].line == 1
    assert outcomes[1] == RawItem(2, {"b": 2})


def test_a_broken_element_in_a_document_is_located_by_line() -> None:
    text = '[\n  {"a": 1},\n  {"b":\n    oops},\n  {"c": 3}\n]\n'
    outcomes = list(read_items(text.splitlines(keepends=True)))
    assert outcomes[0] == RawItem(2, {"a": 1})
    assert isinstance(outcomes[1], ItemError) and outcomes[1].line == 4
    assert outcomes[2] == RawItem(5, {"c": 3})


def test_structural_errors_of_a_document_are_reported() -> None:
    cases = {
        '[{"a": 1} {"b": 2}]': "missing ','",
        '[{"a": 1},]': "trailing ','",
        '[{"a": 1}': "ends before its closing bracket",
        '{"a": 1} {"b": 2}': "after the end",
        '"just a string"': "not a JSON array or object",
    }
    for text, message in cases.items():
        errors = [o for o in read_json_document([text]) if isinstance(o, ItemError)]
        assert errors and message in errors[-1].message, text


def test_scalar_json_lines_are_not_records() -> None:
    [outcome] = list(read_jsonl(["42\n"]))
    assert isinstance(outcome, ItemError) and outcome.code == "INVALID_RECORD"


def test_escaped_quotes_and_brackets_inside_strings_do_not_confuse_the_splitter() -> None:
    items = [{"text": 'a "quoted" ] and } and \\ and \\"'}, {"text": "[{,}]"}]
    text = json.dumps(items)
    for size in range(1, 8):
        assert [i.value for i in read_json_document(chunked(text, [size] * len(text)))] == items


def test_absurdly_deep_nesting_is_an_error_not_a_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    [jsonl_error] = list(read_jsonl([deep]))
    assert jsonl_error.code == "INVALID_JSON" and "deep" in jsonl_error.message
    errors = list(read_json_document(["[", '{"a": ' + deep + "}", "]"]))
    assert [e.code for e in errors] == ["INVALID_JSON"]
