"""The OpenAI → ShareGPT conversion exactly as docs/TRAJECTORIES.md#conversion states it, and record round trips."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.trajectories.convert import convert_openai_messages
from rlctl.trajectories.importing import ImportedRecord, import_items
from rlctl.trajectories.reading import read_items
from rlctl.trajectories.records import TrajectoryRecord, record_from_dict, record_to_dict


def convert(messages: list[dict]) -> list[tuple[str, str]]:
    return [(turn.role, turn.value) for turn in convert_openai_messages(messages).build()]


def tool_call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_roles_map_system_user_assistant_tool_to_system_human_gpt_tool() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "List files."},
        {
            "role": "assistant",
            "content": "Listing.",
            "tool_calls": [tool_call("c1", "terminal", '{"cmd": "ls"}')],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "assistant", "content": "One file: a.txt."},
    ]
    assert convert(messages) == [
        ("system", "Be brief."),
        ("human", "List files."),
        ("gpt", 'Listing.\n<tool_call>\n{"name": "terminal", "arguments": {"cmd": "ls"}}\n</tool_call>'),
        (
            "tool",
            '<tool_response>\n{"tool_call_id": "c1", "name": "terminal", "content": "a.txt"}\n</tool_response>',
        ),
        ("gpt", "One file: a.txt."),
    ]


def test_reasoning_fields_are_wrapped_in_think_before_the_content() -> None:
    for field in ("reasoning", "reasoning_content"):
        [(_, value)] = convert([{"role": "assistant", "content": "42", field: "6 times 7"}])
        assert value == "<think>\n6 times 7\n</think>\n42"


def test_existing_scratchpad_tags_become_think() -> None:
    content = "<REASONING_SCRATCHPAD>check the docs</REASONING_SCRATCHPAD>Done."
    [(_, value)] = convert([{"role": "assistant", "content": content}])
    assert value == "<think>\ncheck the docs\n</think>Done."


def test_each_tool_call_is_appended_with_parsed_arguments_and_non_json_arguments_kept() -> None:
    calls = [tool_call("a", "read", '{"path": "x.py"}'), tool_call("b", "shell", "ls -la")]
    builder = convert_openai_messages([{"role": "assistant", "content": None, "tool_calls": calls}])
    [turn] = builder.build()
    assert turn.value == (
        '<tool_call>\n{"name": "read", "arguments": {"path": "x.py"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "shell", "arguments": "ls -la"}\n</tool_call>'
    )
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("a", "read", {"path": "x.py"}),
        ("b", "shell", "ls -la"),
    ]


def test_tool_result_names_come_from_the_call_when_the_message_has_none() -> None:
    messages = [
        {"role": "assistant", "content": "", "tool_calls": [tool_call("c9", "search", "{}")]},
        {"role": "tool", "tool_call_id": "c9", "content": "nothing found"},
    ]
    tool = convert_openai_messages(messages).build()[1]
    assert (tool.tool_call_id, tool.name) == ("c9", "search")
    assert json.loads(tool.value.split("\n")[1]) == {
        "tool_call_id": "c9",
        "name": "search",
        "content": "nothing found",
    }


def test_content_parts_and_legacy_function_results_are_understood() -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Hello "},
                {"type": "image_url"},
                {"type": "text", "text": "there"},
            ],
        },
        {"role": "assistant", "content": None, "function_call": {"name": "lookup", "arguments": '{"q": 1}'}},
        {"role": "function", "name": "lookup", "content": "found"},
    ]
    turns = convert_openai_messages(messages).build()
    assert turns[0].value == "Hello there"
    assert turns[1].tool_calls[0].name == "lookup" and turns[2].tool_call_id == turns[1].tool_calls[0].id


def test_non_ascii_text_is_kept_readable() -> None:
    messages = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [tool_call("c", "dịch", '{"văn_bản": "xin chào"}')],
        },
        {"role": "tool", "tool_call_id": "c", "content": "hello"},
    ]
    gpt, tool = convert(messages)
    assert '"văn_bản": "xin chào"' in gpt[1] and '"name": "dịch"' in tool[1]


def test_stored_records_round_trip_exactly(all_real_records) -> None:
    lines = [json.dumps(record_to_dict(record), ensure_ascii=False) for _, record in all_real_records]
    reimported = list(import_items(read_items(lines)))
    assert all(isinstance(o, ImportedRecord) for o in reimported)
    assert [o.record for o in reimported] == [record for _, record in all_real_records]


def test_plain_sharegpt_export_keeps_tool_call_ids_and_names(all_real_records) -> None:
    """Only from/value written (what any ShareGPT consumer keeps): ids and names come back from the tags."""
    for name, record in all_real_records:
        if not any(turn.tool_calls for turn in record.turns):
            continue
        plain = {"conversations": [{"from": t.role, "value": t.value} for t in record.turns]}
        [outcome] = list(import_items(read_items([json.dumps(plain)]), fmt="sharegpt"))
        assert isinstance(outcome, ImportedRecord), (name, outcome)
        back = outcome.record.turns
        assert [(t.tool_call_id, t.name) for t in back] == [(t.tool_call_id, t.name) for t in record.turns], name
        assert [[c.name for c in t.tool_calls] for t in back] == [[c.name for c in t.tool_calls] for t in record.turns]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["system", "human", "gpt"]), st.text(max_size=40)),
        min_size=1,
        max_size=6,
    ),
    st.dictionaries(st.text(min_size=1, max_size=5), st.integers() | st.text(max_size=5), max_size=3),
)
def test_record_dict_round_trip_property(turns, metadata) -> None:
    from rlctl.trajectories.records import Turn

    record = TrajectoryRecord(turns=tuple(Turn(role, value) for role, value in turns), metadata=metadata)
    assert record_from_dict(json.loads(json.dumps(record_to_dict(record)))) == record
