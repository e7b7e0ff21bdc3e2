"""Per-record statistics and a streaming per-dataset accumulator."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rlctl.trajectories.quantiles import DistributionSummary
from rlctl.trajectories.records import ROLES, TrajectoryRecord, Turn
from rlctl.trajectories.tags import has_reasoning, parse_tagged_tool_response
from rlctl.trajectories.tokens import TokenCounter

UNKNOWN_TOOL = "unknown"
# A result whose first characters mention an error failed, as the collection runner this follows counts them.
ERROR_MARKER = "error"
ERROR_WINDOW = 100


@dataclass
class ToolCounts:
    count: int = 0  # calls made (plus results whose call is missing)
    success: int = 0
    failure: int = 0
    unanswered: int = 0  # calls that never got a result

    def add(self, other: ToolCounts) -> None:
        self.count += other.count
        self.success += other.success
        self.failure += other.failure
        self.unanswered += other.unanswered

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "success": self.success,
            "failure": self.failure,
            "unanswered": self.unanswered,
            "success_rate": _rate(self.success, self.count),
            "failure_rate": _rate(self.failure, self.count),
        }


@dataclass(frozen=True, slots=True)
class ReasoningStats:
    total_assistant_turns: int
    turns_with_reasoning: int

    @property
    def turns_without_reasoning(self) -> int:
        return self.total_assistant_turns - self.turns_with_reasoning

    @property
    def has_any_reasoning(self) -> bool:
        return self.turns_with_reasoning > 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "total_assistant_turns": self.total_assistant_turns,
            "turns_with_reasoning": self.turns_with_reasoning,
            "turns_without_reasoning": self.turns_without_reasoning,
            "has_any_reasoning": self.has_any_reasoning,
        }


@dataclass(frozen=True, slots=True)
class RecordStats:
    tool_stats: dict[str, ToolCounts]
    reasoning_stats: ReasoningStats
    completed: bool
    api_calls: int  # model calls, i.e. gpt turns
    turns: int
    tokens: int
    tokens_by_role: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return {
            "tool_stats": {name: counts.as_dict() for name, counts in sorted(self.tool_stats.items())},
            "reasoning_stats": self.reasoning_stats.as_dict(),
            "completed": self.completed,
            "api_calls": self.api_calls,
            "turns": self.turns,
            "tokens": {"total": self.tokens, "by_role": self.tokens_by_role},
        }


def tool_result_failed(turn: Turn) -> bool:
    """A result fails when the source says so; otherwise when it carries a non-null ``error`` or
    ``success: false``, is empty, or mentions "error" (any case) in its first 100 characters."""
    if turn.success is not None:
        return not turn.success
    wrapper = parse_tagged_tool_response(turn.value)
    if wrapper is None:
        return _content_failed(turn.value)
    return _flags_failure(wrapper) or _content_failed(wrapper.get("content"))


def is_completed(record: TrajectoryRecord) -> bool:
    """What the source says; otherwise whether the trajectory ends with a gpt turn that calls no tool."""
    if record.completed is not None:
        return record.completed
    last = record.turns[-1] if record.turns else None
    return last is not None and last.role == "gpt" and not last.tool_calls


def reasoning_stats(record: TrajectoryRecord) -> ReasoningStats:
    assistant = [turn for turn in record.turns if turn.role == "gpt"]
    return ReasoningStats(len(assistant), sum(1 for turn in assistant if has_reasoning(turn.value)))


def tool_stats(record: TrajectoryRecord) -> dict[str, ToolCounts]:
    stats: dict[str, ToolCounts] = {}
    pending: list[tuple[str, str]] = []  # (call id, tool name), oldest first
    for turn in record.turns:
        for call in turn.tool_calls:
            stats.setdefault(call.name, ToolCounts()).count += 1
            pending.append((call.id, call.name))
        if turn.role == "tool":
            called = _take_call(pending, turn.tool_call_id, turn.name)
            counts = stats.setdefault(called or turn.name or UNKNOWN_TOOL, ToolCounts())
            if called is None:
                counts.count += 1
            if tool_result_failed(turn):
                counts.failure += 1
            else:
                counts.success += 1
    for _, name in pending:
        stats[name].unanswered += 1
    return stats


RECORD_STATS_KEYS = ("tool_stats", "reasoning_stats", "api_calls")


def record_stats_fields(record: TrajectoryRecord) -> dict[str, Any]:
    """The per-record statistics a stored or exported record carries beside its turns (derived, never read)."""
    return {
        "tool_stats": {name: counts.as_dict() for name, counts in sorted(tool_stats(record).items())},
        "reasoning_stats": reasoning_stats(record).as_dict(),
        "api_calls": sum(1 for turn in record.turns if turn.role == "gpt"),
    }


def compute_record_stats(record: TrajectoryRecord, counter: TokenCounter) -> RecordStats:
    by_role: dict[str, int] = dict.fromkeys(ROLES, 0)
    for turn in record.turns:
        by_role[turn.role] += counter.count(turn.value)
    return RecordStats(
        tool_stats=tool_stats(record),
        reasoning_stats=reasoning_stats(record),
        completed=is_completed(record),
        api_calls=sum(1 for turn in record.turns if turn.role == "gpt"),
        turns=len(record.turns),
        tokens=sum(by_role.values()),
        tokens_by_role=by_role,
    )


@dataclass
class DatasetStats:
    """Feed it each record's stats; memory stays bounded whatever the dataset's size."""

    records: int = 0
    completed: int = 0
    records_with_reasoning: int = 0
    assistant_turns: int = 0
    assistant_turns_with_reasoning: int = 0
    api_calls: int = 0
    tool_stats: dict[str, ToolCounts] = field(default_factory=dict)
    tokens: DistributionSummary = field(default_factory=DistributionSummary)
    turns: DistributionSummary = field(default_factory=DistributionSummary)

    def add(self, stats: RecordStats) -> None:
        self.records += 1
        self.completed += stats.completed
        self.records_with_reasoning += stats.reasoning_stats.has_any_reasoning
        self.assistant_turns += stats.reasoning_stats.total_assistant_turns
        self.assistant_turns_with_reasoning += stats.reasoning_stats.turns_with_reasoning
        self.api_calls += stats.api_calls
        for name, counts in stats.tool_stats.items():
            self.tool_stats.setdefault(name, ToolCounts()).add(counts)
        self.tokens.add(stats.tokens)
        self.turns.add(stats.turns)

    def merge(self, other: DatasetStats) -> None:
        for name in ("records", "completed", "records_with_reasoning", "assistant_turns", "api_calls"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.assistant_turns_with_reasoning += other.assistant_turns_with_reasoning
        for name, counts in other.tool_stats.items():
            self.tool_stats.setdefault(name, ToolCounts()).add(counts)
        self.tokens.merge(other.tokens)
        self.turns.merge(other.turns)

    def as_dict(self) -> dict[str, Any]:
        total_calls = ToolCounts()
        for counts in self.tool_stats.values():
            total_calls.add(counts)
        return {
            "records": self.records,
            "completed": self.completed,
            "completion_rate": _rate(self.completed, self.records),
            "tool_stats": {name: counts.as_dict() for name, counts in sorted(self.tool_stats.items())},
            "tool_calls": total_calls.as_dict(),
            "reasoning_stats": {
                "total_assistant_turns": self.assistant_turns,
                "turns_with_reasoning": self.assistant_turns_with_reasoning,
                "turns_without_reasoning": self.assistant_turns - self.assistant_turns_with_reasoning,
                "records_with_reasoning": self.records_with_reasoning,
                "has_any_reasoning": self.records_with_reasoning > 0,
            },
            "api_calls": {"total": self.api_calls, "mean": _rate(self.api_calls, self.records)},
            "tokens": {"total": int(self.tokens.total), **self.tokens.as_dict()},
            "turns": self.turns.as_dict(),
        }


def _take_call(pending: list[tuple[str, str]], call_id: str | None, name: str | None) -> str | None:
    """Pairs a result with the oldest open call it answers, so each call is counted once.

    Agents reuse call ids (tau-bench does, even within one turn), so an id alone can name several open calls: a
    result that also names its tool takes the open call with both its id and its name, else the oldest with its
    id. A result without an id takes the oldest open call of its tool, else the oldest open call."""
    candidates = [i for i, (pending_id, _) in enumerate(pending) if call_id is None or pending_id == call_id]
    named = [i for i in candidates if pending[i][1] == name]
    chosen = named or candidates
    return pending.pop(chosen[0])[1] if chosen else None


def _flags_failure(payload: dict[str, Any]) -> bool:
    return payload.get("error") is not None or payload.get("success") is False


def _content_failed(content: Any) -> bool:
    if content is None:
        return True
    if isinstance(content, dict) and _flags_failure(content):
        return True
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    stripped = text.strip()
    if not stripped or ERROR_MARKER in text[:ERROR_WINDOW].lower():
        return True
    if stripped.startswith("{"):
        try:
            payload = json.loads(stripped)
        except ValueError:
            return False
        return isinstance(payload, dict) and _flags_failure(payload)
    return False


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None
