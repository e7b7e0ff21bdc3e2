"""Filter predicates: reasoning, completion, hallucinated tool names, token bounds."""

from __future__ import annotations

import pytest

from rlctl.trajectories.filters import (
    FilterCriteria,
    FilterReport,
    drop_reasons,
    hallucinated_tool_names,
    is_incomplete,
    lacks_reasoning,
)
from rlctl.trajectories.records import ToolCall, TrajectoryRecord, Turn
from rlctl.trajectories.tokens import record_token_count


def record_calling(*names: str, declared: tuple[str, ...] | None = None) -> TrajectoryRecord:
    calls = tuple(ToolCall(f"c{i}", name, {}) for i, name in enumerate(names))
    return TrajectoryRecord(turns=(Turn("human", "go"), Turn("gpt", "", tool_calls=calls)), declared_tools=declared)


def test_hallucinated_tool_names_against_the_allowed_or_declared_list() -> None:
    record = record_calling("bash", "teleport", declared=("bash", "read"))
    assert hallucinated_tool_names(record) == {"teleport"}
    assert hallucinated_tool_names(record, allowed={"teleport", "bash"}) == set()
    assert hallucinated_tool_names(record_calling("anything")) == set()  # nothing to judge against


def test_real_records_call_only_the_tools_their_sources_declare(all_real_records) -> None:
    judged = [record for _, record in all_real_records if record.declared_tools is not None]
    assert len(judged) > 20
    assert not [record for record in judged if hallucinated_tool_names(record)]
    tau = next(record for name, record in all_real_records if name.startswith("tau-bench"))
    assert hallucinated_tool_names(tau, allowed={"calculate"}) >= {"get_user_details"}


def test_reasoning_and_completion_predicates_on_real_data(real_records) -> None:
    assert not any(lacks_reasoning(r) for r in real_records["llamafactory-reason-tool-use-demo-50.jsonl"])
    assert all(lacks_reasoning(r) for r in real_records["tau-bench-gpt-4o-airline.json"])
    assert [is_incomplete(r) for r in real_records["openhands-multi-swe-bench-output.jsonl"]] == [False, True]


def test_drop_reasons_and_report(real_records, approx_counter) -> None:
    criteria = FilterCriteria(drop_without_reasoning=True, drop_incomplete=True, max_tokens=20_000, min_tokens=100)
    report = FilterReport()
    for record in real_records["openhands-multi-swe-bench-output.jsonl"]:
        reasons = drop_reasons(record, criteria, approx_counter)
        tokens = record_token_count(record, approx_counter)
        assert ("too_long" in reasons) == (tokens > 20_000)
        assert "no_reasoning" in reasons
        report.add(reasons)
    assert report.as_dict()["dropped"] == 2 and report.as_dict()["reasons"]["no_reasoning"] == 2
    assert report.as_dict()["reasons"]["incomplete"] == 1
    keep_all = FilterCriteria()
    assert drop_reasons(real_records["tau-bench-gpt-4o-airline.json"][0], keep_all) == []


def test_token_bounds_need_a_counter() -> None:
    with pytest.raises(ValueError, match="token counter"):
        drop_reasons(record_calling("x"), FilterCriteria(max_tokens=10))
