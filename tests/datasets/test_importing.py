"""Importing every real format, format detection, and per-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rlctl.trajectories.importing import FORMATS, ImportedRecord, detect_format, import_item, import_items
from rlctl.trajectories.reading import ItemError, RawItem, read_items
from rlctl.trajectories.records import TrajectoryRecord
from rlctl.trajectories.rewards import CorrectnessReward
from tests.datasets.realdata import EXPECTED_FILES, import_file


def only_record(outcomes: list) -> TrajectoryRecord:
    [outcome] = outcomes
    assert isinstance(outcome, ImportedRecord), outcome
    return outcome.record


def errors_of(lines: list[str], fmt: str = "auto") -> list[ItemError]:
    return [o for o in import_items(read_items(lines), fmt=fmt) if isinstance(o, ItemError)]


@pytest.mark.parametrize("name", sorted(EXPECTED_FILES))
def test_every_real_file_imports_whole_with_the_detected_format(trajectories_dir: Path, name: str) -> None:
    expected_format, expected_count = EXPECTED_FILES[name]
    outcomes = import_file(trajectories_dir / name)
    assert not [o for o in outcomes if isinstance(o, ItemError)]
    assert len(outcomes) == expected_count
    assert {o.record.source_format for o in outcomes} == {expected_format}
    explicit = import_file(trajectories_dir / name, fmt=expected_format)
    assert [o.record for o in explicit] == [o.record for o in outcomes]


def test_all_turns_of_real_records_have_known_roles_and_paired_tool_results(all_real_records) -> None:
    for name, record in all_real_records:
        calls_seen: set[str] = set()
        for turn in record.turns:
            assert turn.role in ("system", "human", "gpt", "tool"), name
            calls_seen.update(call.id for call in turn.tool_calls)
            if turn.role == "tool":
                assert turn.tool_call_id in calls_seen, (name, turn.value[:80])
                assert turn.name and turn.value.startswith("<tool_response>"), name


def test_tau_bench_keeps_task_reward_and_reused_call_ids(real_records) -> None:
    records = real_records["tau-bench-gpt-4o-airline.json"]
    first = records[0]
    assert {"task_id", "reward", "info", "trial"} <= first.metadata.keys() and "traj" not in first.metadata
    tool_turns = [t for r in records for t in r.turns if t.role == "tool"]
    assert len(tool_turns) == 45  # SOURCES.md: 45 tool messages in the excerpt
    # The agent reused call_HGn16KZh9oNCruxsMJ4gYXan for two different tools; each result names its own call.
    reused = [t.name for t in first.turns if t.tool_call_id == "call_HGn16KZh9oNCruxsMJ4gYXan"]
    assert reused == ["search_direct_flight", "search_onestop_flight"]
    assert first.completed is True  # the simulated user ended with ###STOP###


def test_swe_agent_tool_call_ids_list_becomes_the_results_call_id(real_records) -> None:
    record = real_records["swe-agent-marshmallow-1867-function-calling.traj"][0]
    assert sum(len(t.tool_calls) for t in record.turns) == 13
    tool_turns = [t for t in record.turns if t.role == "tool"]
    assert len(tool_turns) == 13
    assert tool_turns[0].tool_call_id == "call_9diWc1DYm4RLmPfHgIaP2wd" and tool_turns[0].name == "bash"
    assert "trajectory" not in record.metadata and "info" in record.metadata
    assert record.completed is True  # exit_status "submitted"


def test_llm_call_log_ends_with_the_logged_response_and_prefers_raw_messages(real_records) -> None:
    claude = real_records["openhands-sdk-llm-log-claude-sonnet-4.json"][0]
    assert len(claude.turns) == 13  # 12 logged messages + the response message
    assert claude.turns[-1].tool_calls[0].name == "finish"
    assert claude.declared_tools == ("terminal", "str_replace_editor", "finish")
    deepseek = real_records["openhands-sdk-llm-log-deepseek-nonfncall.json"][0]
    assert sum(len(t.tool_calls) for t in deepseek.turns) == 4  # raw_messages carry real tool_calls
    assert not any("EXECUTION RESULT of" in t.value for t in deepseek.turns)


def test_responses_rollouts_merge_reasoning_and_calls_into_one_model_turn(real_records) -> None:
    record = real_records["nemo-gym-conversational-tool-use-rollouts.jsonl"][0]
    assert [t.role for t in record.turns] == ["system", "human", "gpt", "tool", "gpt"]
    calling_turn = record.turns[2]
    # The reasoning item came between the call and its output, and still belongs to the calling turn.
    assert calling_turn.value.startswith("<think>\nI need to help this user")
    assert [c.name for c in calling_turn.tool_calls] == ["request_accessibility"]
    assert record.metadata["reward"] == 1 and "input" not in record.metadata["responses_create_params"]
    assert record.completed is True
    assert "authenticate_user" in (record.declared_tools or ())


def test_responses_with_think_tags_in_text_and_unanswered_calls(real_records) -> None:
    record = real_records["nemo-gym-mini-swe-agent-2-rollouts.jsonl"][0]
    assert record.turns[2].value.startswith("<think>")
    calls = [c.id for t in record.turns for c in t.tool_calls]
    answered = {t.tool_call_id for t in record.turns if t.role == "tool"}
    assert len(calls) == 8 and len(answered) == 7


def test_openhands_events_become_one_turn_per_completion_with_outcomes(real_records) -> None:
    records = real_records["openhands-multi-swe-bench-output.jsonl"]
    first = records[0]
    assert [t.role for t in first.turns[:4]] == ["system", "human", "gpt", "tool"]
    assert first.turns[3].success is True and first.turns[3].name == "execute_bash"
    assert any(t.success is False for t in first.turns)  # failed commands keep OpenHands' own verdict
    assert [r.completed for r in records] == [True, False]  # the last hit the iteration limit
    # An error observation without a tool call is what the model saw as a user message.
    assert any(t.role == "human" and "Parameter 'command'" in t.value for t in records[1].turns)


def test_llamafactory_sharegpt_roles_become_tagged_calls_and_results(real_records) -> None:
    record = real_records["llamafactory-glaive-toolcall-en-demo.json"][3]
    gpt_call, tool = record.turns[1], record.turns[2]
    assert gpt_call.value == (
        '<tool_call>\n{"name": "calculate_area", "arguments": {"shape": "rectangle", "dimensions": [5, 3]}}'
        "\n</tool_call>"
    )
    assert tool.tool_call_id == gpt_call.tool_calls[0].id and tool.name == "calculate_area"
    assert record.declared_tools == ("calculate_area", "calculate_discount")


def test_llamafactory_v1_reasoning_parts_become_think_blocks(real_records) -> None:
    records = real_records["llamafactory-reason-tool-use-demo-50.jsonl"]
    assert all(any(t.value.startswith("<think>") for t in r.turns if t.role == "gpt") for r in records)
    assert sum(len(t.tool_calls) for r in records for t in r.turns) == 12  # counted in the raw excerpt


def test_hermes_sharegpt_declares_tools_from_its_system_prompt(real_records) -> None:
    record = real_records["hermes-agent-fork-lucifexia-trajectory-samples.jsonl"][0]
    assert record.completed is True and record.metadata["model"] == "nvidia/nemotron-3-ultra-550b-a55b"
    assert record.declared_tools and len(record.declared_tools) > 5


def test_other_keys_of_an_openai_line_become_metadata_used_by_correctness() -> None:
    line = {
        "messages": [
            {
                "role": "user",
                "content": "Natalia sold 48 clips in April and half as many in May. How many in all?",
            },
            {"role": "assistant", "content": "48 + 24 = 72", "reasoning_content": "May: 48 / 2 = 24."},
        ],
        "answer": "72",
        "task_id": "gsm8k-0",
    }
    record = only_record(list(import_items(read_items([json.dumps(line)]))))
    assert record.metadata == {"answer": "72", "task_id": "gsm8k-0"}
    assert record.turns[-1].value == "<think>\nMay: 48 / 2 = 24.\n</think>\n48 + 24 = 72"
    assert CorrectnessReward()(record) == 2.0


def test_detection_is_unambiguous_or_refuses() -> None:
    assert detect_format({"messages": [{"role": "user", "content": "x"}]}) == "openai"
    assert detect_format([{"from": "human", "value": "x"}]) == "sharegpt"
    both = {
        "messages": [{"role": "user", "content": "x"}],
        "conversations": [{"from": "human", "value": "x"}],
    }
    assert detect_format(both) is None
    outcome = import_item(RawItem(7, both))
    assert isinstance(outcome, ItemError) and outcome.code == "UNKNOWN_FORMAT" and outcome.line == 7
    assert "several formats" in outcome.message
    unknown = import_item(RawItem(3, {"foo": 1}))
    assert isinstance(unknown, ItemError) and unknown.code == "UNKNOWN_FORMAT"


def test_explicit_format_that_does_not_fit_is_a_per_item_error() -> None:
    [error] = errors_of(['{"conversations": [{"from": "human", "value": "hi"}]}\n'], fmt="tau_bench")
    assert error.code == "INVALID_RECORD" and error.line == 1
    with pytest.raises(ValueError, match="unknown format"):
        list(import_items(read_items(["{}"]), fmt="nope"))


def test_bad_input_gets_clear_per_line_errors_while_good_lines_import() -> None:
    good = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
    lines = [
        json.dumps(good),
        '{"messages": [{"role": "user", "content": "unterminated"}',
        json.dumps({"messages": [{"role": "robot", "content": "beep"}]}),
        json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c1"}]}),
        json.dumps({"conversations": [{"from": "human", "value": "x"}, {"from": "wizard", "value": "y"}]}),
        json.dumps({"messages": []}),
        json.dumps(good),
    ]
    outcomes = list(import_items(read_items(lines)))
    assert [o.line for o in outcomes] == [1, 2, 3, 4, 5, 6, 7]
    assert isinstance(outcomes[0], ImportedRecord) and isinstance(outcomes[6], ImportedRecord)
    codes = {o.line: (o.code, o.path) for o in outcomes if isinstance(o, ItemError)}
    assert codes == {
        2: ("INVALID_JSON", None),
        3: ("UNKNOWN_ROLE", "messages[0].role"),
        4: ("TOOL_RESULT_WITHOUT_CALL", "messages[1]"),
        5: ("UNKNOWN_ROLE", "conversations[1].from"),
        6: ("EMPTY_RECORD", None),
    }
    assert "'robot'" in outcomes[2].message and "'c1'" in outcomes[3].message


def test_tool_result_without_call_is_caught_in_every_format() -> None:
    cases = {
        "sharegpt": {"conversations": [{"from": "human", "value": "x"}, {"from": "observation", "value": "42"}]},
        "responses": {
            "responses_create_params": {"input": "x"},
            "response": {"output": [{"type": "function_call_output", "call_id": "zz", "output": "1"}]},
        },
        "llamafactory": {
            "messages": [
                {"role": "user", "content": [{"type": "text", "value": "x"}]},
                {"role": "tool", "content": [{"type": "text", "value": "result"}]},
            ]
        },
        "tau_bench": {"task_id": 1, "traj": [{"role": "tool", "tool_call_id": "a", "content": "x"}]},
    }
    for fmt, item in cases.items():
        [error] = errors_of([json.dumps(item)], fmt=fmt)
        assert error.code == "TOOL_RESULT_WITHOUT_CALL", fmt


def test_a_result_answers_only_a_call_not_yet_answered() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "tool", "tool_call_id": "c1", "content": "again"},
    ]
    [error] = errors_of([json.dumps(messages)])
    assert error.code == "TOOL_RESULT_WITHOUT_CALL" and error.path == "$[2]"


# Keys and values that real formats use, so generated items reach deep into every importer.
ITEM_KEYS = [
    "messages",
    "conversations",
    "role",
    "content",
    "from",
    "value",
    "tool_calls",
    "traj",
    "history",
    "response",
    "output",
    "type",
    "call_id",
    "name",
    "arguments",
    "responses_create_params",
    "input",
    "source",
    "action",
    "observation",
    "tool_call_metadata",
    "function",
    "id",
    "tool_call_id",
    "args",
    "model_response",
    "choices",
    "message",
    "summary",
    "text",
    "tool_call_ids",
    "reasoning",
    "tools",
    "success",
    "instructions",
    "metadata",
    "source_format",
]
ROLE_LIKE = [
    "user",
    "assistant",
    "system",
    "tool",
    "human",
    "gpt",
    "function_call",
    "observation",
    "message",
    "function_call_output",
    "reasoning",
    "text",
    "tool_call",
    "run",
    "finish",
    "error",
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 2) | st.text(max_size=5) | st.sampled_from(ROLE_LIKE),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(ITEM_KEYS), inner, max_size=6),
    max_leaves=40,
)


@settings(max_examples=500, deadline=None)
@given(json_values, st.sampled_from(["auto", *FORMATS]))
@example({"history": [{"action": []}]}, "openhands")  # once found: an unhashable action was looked up in a set
def test_any_json_item_gives_a_record_or_an_error_never_an_exception(value, fmt) -> None:
    outcome = import_item(RawItem(1, value), fmt)
    assert isinstance(outcome, ImportedRecord | ItemError)
    if isinstance(outcome, ImportedRecord):
        assert outcome.record.turns


BATCH_RUNNER_RECORD = {
    "prompt_index": 3,
    "trajectory": [
        {"from": "system", "value": "You are an agent."},
        {"from": "human", "value": "List the files."},
        {
            "from": "gpt",
            "value": '<think>run ls</think>\n<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n'
            "</tool_call>",
        },
        {"from": "tool", "value": '<tool_response>\n{"tool_call_id": "call_1", "content": "a.txt"}\n</tool_response>'},
        {"from": "gpt", "value": "There is a.txt."},
    ],
    "tool_stats": {"terminal": {"count": 1, "success": 1, "failure": 0}},
    "reasoning_stats": {"total_assistant_turns": 2, "turns_with_reasoning": 1},
    "completed": True,
    "api_calls": 2,
    "toolsets_used": ["terminal"],
}


def test_a_batch_runner_record_is_detected_and_keeps_completion_and_toolsets() -> None:
    assert detect_format(BATCH_RUNNER_RECORD) == "batch_runner"
    record = only_record(list(import_items(read_items([json.dumps(BATCH_RUNNER_RECORD)]))))
    assert record.source_format == "batch_runner" and record.completed is True
    assert [t.role for t in record.turns] == ["system", "human", "gpt", "tool", "gpt"]
    assert [(c.id, c.name) for c in record.turns[2].tool_calls] == [("call_1", "terminal")]
    assert record.turns[3].tool_call_id == "call_1" and record.turns[3].name == "terminal"
    # The runner's own statistics are recomputed from the turns; the rest is metadata.
    assert record.metadata == {"prompt_index": 3, "toolsets_used": ["terminal"]}
    # A SWE-agent `trajectory` (steps, not turns) is not taken for one.
    assert detect_format({"trajectory": [{"action": "ls", "observation": "a"}]}) is None


def test_a_batch_runner_record_of_chat_messages_is_a_clear_error() -> None:
    item = {**BATCH_RUNNER_RECORD, "trajectory": [{"role": "user", "content": "x"}]}
    [error] = errors_of([json.dumps(item)], fmt="batch_runner")
    assert error.code == "INVALID_RECORD" and error.path == "trajectory[0]"


def test_an_openhands_action_that_is_not_a_string_is_an_invalid_record() -> None:
    outcome = import_item(
        RawItem(4, {"history": [{"action": "system", "content": "hi"}, {"action": ["run"]}]}), "openhands"
    )
    assert isinstance(outcome, ItemError)
    assert (outcome.code, outcome.path, outcome.line) == ("INVALID_RECORD", "history[1].action", 4), outcome
