"""Filter predicates over records, and a criteria object that names why a record is dropped."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from rlctl.trajectories.records import TrajectoryRecord
from rlctl.trajectories.stats import is_completed, reasoning_stats
from rlctl.trajectories.tokens import TokenCounter, record_token_count

NO_REASONING = "no_reasoning"
INCOMPLETE = "incomplete"
HALLUCINATED_TOOLS = "hallucinated_tools"
TOO_SHORT = "too_short"
TOO_LONG = "too_long"


def lacks_reasoning(record: TrajectoryRecord) -> bool:
    """No gpt turn holds a non-empty <think> block."""
    return not reasoning_stats(record).has_any_reasoning


def is_incomplete(record: TrajectoryRecord) -> bool:
    return not is_completed(record)


def hallucinated_tool_names(record: TrajectoryRecord, allowed: Collection[str] | None = None) -> set[str]:
    """Names the record calls that are not in ``allowed`` (default: the tools its source declared).

    Without either list nothing can be judged, so nothing is reported.
    """
    permitted = allowed if allowed is not None else record.declared_tools
    if permitted is None:
        return set()
    permitted = set(permitted)
    return {call.name for turn in record.turns for call in turn.tool_calls if call.name not in permitted}


@dataclass(frozen=True)
class FilterCriteria:
    drop_without_reasoning: bool = False
    drop_incomplete: bool = False
    drop_hallucinated_tools: bool = False
    allowed_tools: frozenset[str] | None = None  # None: each record's declared tools
    min_tokens: int | None = None
    max_tokens: int | None = None

    @property
    def needs_tokens(self) -> bool:
        return self.min_tokens is not None or self.max_tokens is not None


def drop_reasons(record: TrajectoryRecord, criteria: FilterCriteria, counter: TokenCounter | None = None) -> list[str]:
    """Why the record should be dropped under ``criteria``; an empty list keeps it."""
    reasons = []
    if criteria.drop_without_reasoning and lacks_reasoning(record):
        reasons.append(NO_REASONING)
    if criteria.drop_incomplete and is_incomplete(record):
        reasons.append(INCOMPLETE)
    if criteria.drop_hallucinated_tools and hallucinated_tool_names(record, criteria.allowed_tools):
        reasons.append(HALLUCINATED_TOOLS)
    if criteria.needs_tokens:
        if counter is None:
            raise ValueError("token bounds need a token counter")
        tokens = record_token_count(record, counter)
        if criteria.min_tokens is not None and tokens < criteria.min_tokens:
            reasons.append(TOO_SHORT)
        if criteria.max_tokens is not None and tokens > criteria.max_tokens:
            reasons.append(TOO_LONG)
    return reasons


@dataclass
class FilterReport:
    """Streaming tally of a filter pass."""

    kept: int = 0
    dropped: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    def add(self, reasons: list[str]) -> None:
        if reasons:
            self.dropped += 1
            self.reasons.update(reasons)
        else:
            self.kept += 1

    def as_dict(self) -> dict[str, Any]:
        return {"kept": self.kept, "dropped": self.dropped, "reasons": dict(sorted(self.reasons.items()))}
