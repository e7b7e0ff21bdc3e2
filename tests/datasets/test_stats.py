"""Per-record and per-dataset statistics, the tool failure rule, and the streaming distribution summary."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.trajectories.convert import TurnBuilder
from rlctl.trajectories.quantiles import DistributionSummary
from rlctl.trajectories.records import ToolCall, TrajectoryRecord, Turn
from rlctl.trajectories.stats import (
    DatasetStats,
    compute_record_stats,
    is_completed,
    tool_result_failed,
    tool_stats,
)
from rlctl.trajectories.tags import render_tool_response


def tool_turn(content: str, success: bool | None = None) -> Turn:
    return Turn("tool", render_tool_response("c", "t", content), tool_call_id="c", name="t", success=success)


@pytest.mark.parametrize(
    ("content", "failed"),
    [
        ('{"output": "ok", "error": null}', True),
        ('{"output": "ok"}', False),
        ('{"output": "", "error": "boom"}', True),
        ('{"success": false, "detail": "x"}', True),
        ('{"success": true}', False),
        ("", True),
        ("   \n", True),
        ("Error: payment amount does not add up", True),
        ("ERROR:\nNo replacement was performed", True),
        ("error: x", True),
        # "error" anywhere in the first 100 characters fails the result, whatever the words around it.
        ("0 errors found, all 12 tests passed", True),
        ("Traceback mentions error handling docs", True),
        ('{"error_count": 0, "result": "fine"}', True),
        ("Errors: none", True),
        ("x" * 95 + "ERROR", True),
        ("x" * 96 + "ERROR", False),
        ("all 12 tests passed", False),
    ],
)
def test_tool_failure_rule(content: str, failed: bool) -> None:
    assert tool_result_failed(tool_turn(content)) is failed


def test_an_explicit_outcome_from_the_source_wins() -> None:
    assert tool_result_failed(tool_turn("all good", success=False)) is True
    assert tool_result_failed(tool_turn("", success=True)) is False


def test_tool_results_that_are_json_objects_in_the_wrapper_are_checked_too() -> None:
    payload = {"tool_call_id": "c", "name": "t", "content": {"error": "denied"}}
    wrapped = f"<tool_response>\n{json.dumps(payload)}\n</tool_response>"
    assert tool_result_failed(Turn("tool", wrapped)) is True
    untagged = Turn("tool", "plain output without tags")
    assert tool_result_failed(untagged) is False


def build_record(*steps: tuple) -> TrajectoryRecord:
    builder = TurnBuilder()
    for step in steps:
        kind = step[0]
        if kind == "human":
            builder.add_text("human", step[1])
        elif kind == "gpt":
            builder.add_assistant(step[1], step[2] if len(step) > 2 else None, step[3] if len(step) > 3 else ())
        elif kind == "tool":
            builder.add_tool_result(step[2], call_id=step[1])
    return TrajectoryRecord(turns=builder.build())


def test_record_stats_count_calls_outcomes_reasoning_and_api_calls(approx_counter) -> None:
    record = build_record(
        ("human", "fix it"),
        (
            "gpt",
            "looking",
            "first check the tests",
            [("a", "bash", {"cmd": "pytest"}), ("b", "read", {"p": "x"})],
        ),
        ("tool", "a", "Error: 2 tests failed"),
        ("tool", "b", "file contents " + "." * 100 + " mention an error past the first 100 characters"),
        ("gpt", "", None, [("c", "bash", {"cmd": "pytest"}), ("d", "edit", {})]),
        ("tool", "c", '{"output": "ok", "error": null}'),
        ("gpt", "Done.", "all green"),
    )
    stats = compute_record_stats(record, approx_counter)
    assert {name: counts.as_dict() for name, counts in stats.tool_stats.items()} == {
        "bash": {
            "count": 2,
            "success": 0,
            "failure": 2,
            "unanswered": 0,
            "success_rate": 0.0,
            "failure_rate": 1.0,
        },
        "read": {
            "count": 1,
            "success": 1,
            "failure": 0,
            "unanswered": 0,
            "success_rate": 1.0,
            "failure_rate": 0.0,
        },
        "edit": {
            "count": 1,
            "success": 0,
            "failure": 0,
            "unanswered": 1,
            "success_rate": 0.0,
            "failure_rate": 0.0,
        },
    }
    assert stats.reasoning_stats.as_dict() == {
        "total_assistant_turns": 3,
        "turns_with_reasoning": 2,
        "turns_without_reasoning": 1,
        "has_any_reasoning": True,
    }
    assert stats.api_calls == 3 and stats.turns == 7 and stats.completed is True
    assert (
        stats.tokens == sum(approx_counter.count(t.value) for t in record.turns) == sum(stats.tokens_by_role.values())
    )
    assert json.loads(json.dumps(stats.as_dict()))["tool_stats"]["bash"]["failure"] == 2


def test_completion_comes_from_the_source_or_else_from_a_final_answer() -> None:
    answered = build_record(("human", "q"), ("gpt", "a"))
    calling = build_record(("human", "q"), ("gpt", "", None, [("x", "f", {})]))
    assert is_completed(answered) and not is_completed(calling)
    assert not is_completed(TrajectoryRecord(turns=answered.turns, completed=False))


def test_a_reused_call_id_counts_each_call_once_under_its_own_tool() -> None:
    calls = (ToolCall("same", "search_direct", {}), ToolCall("same", "search_onestop", {}))
    record = TrajectoryRecord(
        turns=(
            Turn("human", "fly me"),
            Turn("gpt", "searching", tool_calls=calls),
            # The results come back in the other order; each names its tool.
            Turn("tool", "Error: no such route", tool_call_id="same", name="search_onestop"),
            Turn("tool", "two flights", tool_call_id="same", name="search_direct"),
            Turn("gpt", "", tool_calls=(ToolCall("same", "search_direct", {}),)),
            Turn("tool", "one flight", tool_call_id="same", name="search_direct"),
        )
    )
    counts = {name: (c.count, c.success, c.failure, c.unanswered) for name, c in tool_stats(record).items()}
    assert counts == {"search_direct": (2, 2, 0, 0), "search_onestop": (1, 0, 1, 0)}


def test_real_tau_bench_counts_each_call_once_per_tool(real_records, trajectories_dir: Path) -> None:
    raw = json.loads((trajectories_dir / "tau-bench-gpt-4o-airline.json").read_text())
    for item, record in zip(raw, real_records["tau-bench-gpt-4o-airline.json"], strict=True):
        called = Counter(c["function"]["name"] for m in item["traj"] for c in m.get("tool_calls") or ())
        assert {name: c.count for name, c in tool_stats(record).items()} == dict(called)


def test_real_tau_bench_results_are_all_counted(real_records, approx_counter, trajectories_dir: Path) -> None:
    dataset = DatasetStats()
    for record in real_records["tau-bench-gpt-4o-airline.json"]:
        dataset.add(compute_record_stats(record, approx_counter))
    summary = dataset.as_dict()
    calls = summary["tool_calls"]
    assert calls["success"] + calls["failure"] == 45 and calls["unanswered"] == 0
    # Empty results and those mentioning "error" in their first 100 characters fail; derived from the raw file.
    raw = json.loads((trajectories_dir / "tau-bench-gpt-4o-airline.json").read_text())
    raw_failures = sum(
        1
        for item in raw
        for message in item["traj"]
        if message["role"] == "tool" and (not message["content"].strip() or "error" in message["content"][:100].lower())
    )
    assert calls["failure"] == raw_failures > 0
    assert summary["records"] == 11 and summary["reasoning_stats"]["has_any_reasoning"] is False
    assert summary["completion_rate"] == summary["completed"] / 11


def test_dataset_stats_stream_and_merge_to_the_same_result(all_real_records, approx_counter) -> None:
    whole, first_half, second_half = DatasetStats(), DatasetStats(), DatasetStats()
    per_record = [compute_record_stats(record, approx_counter) for _, record in all_real_records]
    for index, stats in enumerate(per_record):
        whole.add(stats)
        (first_half if index < len(per_record) // 2 else second_half).add(stats)
    first_half.merge(second_half)
    assert first_half.as_dict() == whole.as_dict()
    summary = whole.as_dict()
    tokens = [stats.tokens for stats in per_record]
    assert summary["tokens"]["total"] == sum(tokens)
    assert summary["tokens"]["min"] == min(tokens) and summary["tokens"]["max"] == max(tokens)
    assert summary["tokens"]["p50"] == pytest.approx(statistics.median(tokens))
    assert summary["tokens"]["p95"] == pytest.approx(statistics.quantiles(tokens, n=20, method="inclusive")[-1])
    assert summary["reasoning_stats"]["records_with_reasoning"] == sum(
        s.reasoning_stats.has_any_reasoning for s in per_record
    )


def test_tool_stats_of_every_real_record_add_up(all_real_records) -> None:
    for name, record in all_real_records:
        for tool, counts in tool_stats(record).items():
            assert counts.count == counts.success + counts.failure + counts.unanswered, (name, tool)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 200_000), min_size=1, max_size=400))
def test_distribution_summary_is_exact_while_small(values) -> None:
    summary = DistributionSummary()
    for value in values:
        summary.add(value)
    assert summary.percentile(50) == pytest.approx(statistics.median(values))
    assert summary.minimum == min(values) and summary.maximum == max(values)
    assert summary.mean == pytest.approx(statistics.fmean(values))


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 1_000_000), min_size=300, max_size=600), st.sampled_from([50, 90, 95, 99]))
def test_distribution_summary_stays_within_its_accuracy_once_bucketed(values, percent) -> None:
    summary = DistributionSummary(relative_accuracy=0.01, exact_limit=100)
    for value in values:
        summary.add(value)
    assert summary._exact is None  # bucketed, bounded memory
    estimate = summary.percentile(percent)
    ordered = sorted(values)
    rank = percent / 100 * (len(values) - 1)
    neighbours = ordered[int(rank)], ordered[min(int(rank) + 1, len(ordered) - 1)]
    assert min(neighbours) * 0.98 <= estimate <= max(neighbours) * 1.02
    halves = DistributionSummary(exact_limit=100), DistributionSummary(exact_limit=100)
    for index, value in enumerate(values):
        halves[index % 2].add(value)
    halves[0].merge(halves[1])
    assert halves[0].count == len(values) and halves[0].percentile(percent) == pytest.approx(estimate, rel=0.03)
