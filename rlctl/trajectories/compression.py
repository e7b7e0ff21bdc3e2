"""Compresses a trajectory to a token budget by summarising as little of its middle as needed.

The rules are written in docs/TRAJECTORIES.md#compression. Unlike the reference's compressor, a record over
budget is compressed however few turns it has, a result that would not be shorter is discarded, and a failed
summary keeps the record as it was: nothing is dropped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from rlctl.trajectories.records import Role, TrajectoryRecord, Turn
from rlctl.trajectories.summarizers import Summarizer
from rlctl.trajectories.tokens import TokenCounter, fit_to_token_budget, turn_token_counts

SUMMARY_PREFIX = "[CONTEXT SUMMARY]: "
SUMMARY_ROLE: Role = "human"  # a user-side note is valid in every chat template, wherever it lands

UNDER_BUDGET = "under_budget"
NOTHING_TO_COMPRESS = "nothing_to_compress"
NO_SAVINGS = "no_savings"
SUMMARIZATION_FAILED = "summarization_failed"


@dataclass(frozen=True)
class CompressionConfig:
    target_max_tokens: int = 15250
    summary_target_tokens: int = 750
    protect_first_system: bool = True
    protect_first_human: bool = True
    protect_first_gpt: bool = True
    protect_first_tool: bool = True
    protect_last_n_turns: int = 4

    def __post_init__(self) -> None:
        if self.target_max_tokens <= 0 or self.summary_target_tokens <= 0 or self.protect_last_n_turns < 0:
            raise ValueError("token targets must be positive and protect_last_n_turns not negative")

    @property
    def protected_first_roles(self) -> tuple[Role, ...]:
        flags: tuple[tuple[Role, bool], ...] = (
            ("system", self.protect_first_system),
            ("human", self.protect_first_human),
            ("gpt", self.protect_first_gpt),
            ("tool", self.protect_first_tool),
        )
        return tuple(role for role, protected in flags if protected)


@dataclass(frozen=True)
class CompressionMetrics:
    original_tokens: int
    compressed_tokens: int
    original_turns: int
    compressed_turns: int
    turns_removed: int = 0  # turns replaced by the summary turn
    summary_tokens: int = 0
    was_compressed: bool = False
    still_over_limit: bool = False
    skipped_reason: str | None = None
    summarization_calls: int = 0
    summarization_errors: int = 0
    error: str | None = None

    @property
    def compression_ratio(self) -> float:
        return self.compressed_tokens / self.original_tokens if self.original_tokens else 1.0

    @property
    def tokens_saved(self) -> int:
        return self.original_tokens - self.compressed_tokens

    def as_dict(self) -> dict[str, Any]:
        return {
            "original_tokens": self.original_tokens,
            "compressed_tokens": self.compressed_tokens,
            "tokens_saved": self.tokens_saved,
            "compression_ratio": self.compression_ratio,
            "original_turns": self.original_turns,
            "compressed_turns": self.compressed_turns,
            "turns_removed": self.turns_removed,
            "summary_tokens": self.summary_tokens,
            "was_compressed": self.was_compressed,
            "still_over_limit": self.still_over_limit,
            "skipped_reason": self.skipped_reason,
            "summarization_calls": self.summarization_calls,
            "summarization_errors": self.summarization_errors,
            "error": self.error,
        }


@dataclass(frozen=True)
class CompressionResult:
    record: TrajectoryRecord  # the compressed record, or the original one when compression was skipped
    metrics: CompressionMetrics


def exchange_blocks(turns: tuple[Turn, ...] | list[Turn]) -> list[tuple[int, int]]:
    """Half-open spans that must stay together: a calling gpt turn up to its last result."""
    reach = list(range(len(turns)))  # the furthest turn each turn is tied to
    owner_of_call: dict[str, int] = {}
    last_caller: int | None = None
    for index, turn in enumerate(turns):
        for call in turn.tool_calls:
            owner_of_call[call.id] = index
            last_caller = index
        if turn.role == "tool":
            owner = owner_of_call.get(turn.tool_call_id or "", last_caller)
            if owner is not None:
                reach[owner] = max(reach[owner], index)
    blocks, start = [], 0
    while start < len(turns):
        end, cursor = reach[start], start
        while cursor <= end:
            end = max(end, reach[cursor])
            cursor += 1
        blocks.append((start, end + 1))
        start = end + 1
    return blocks


def protected_turns(turns: tuple[Turn, ...] | list[Turn], config: CompressionConfig) -> set[int]:
    protected = set(range(max(0, len(turns) - config.protect_last_n_turns), len(turns)))
    for role in config.protected_first_roles:
        first = next((index for index, turn in enumerate(turns) if turn.role == role), None)
        if first is not None:
            protected.add(first)
    return protected


def plan_span(
    turns: tuple[Turn, ...] | list[Turn], counts: list[int], config: CompressionConfig
) -> tuple[int, int] | None:
    """The half-open span of turns to summarise, or None when nothing may be summarised.

    The compressible region is the largest run (in tokens) of whole exchanges holding no protected turn; the
    span grows from its start until removing it, less the summary's budget, brings the record under target.
    """
    protected = protected_turns(turns, config)
    regions: list[list[tuple[int, int]]] = [[]]
    for start, end in exchange_blocks(turns):
        if any(index in protected for index in range(start, end)):
            regions.append([])
        else:
            regions[-1].append((start, end))
    region = max(regions, key=lambda blocks: sum(counts[blocks[0][0] : blocks[-1][1]]) if blocks else -1)
    if not region:
        return None
    needed = sum(counts) - config.target_max_tokens + config.summary_target_tokens
    removed, span_end = 0, region[0][0]
    for start, end in region:
        removed += sum(counts[start:end])
        span_end = end
        if removed >= needed:
            break
    return region[0][0], span_end


def compress_record(
    record: TrajectoryRecord,
    counter: TokenCounter,
    summarizer: Summarizer,
    config: CompressionConfig | None = None,
) -> CompressionResult:
    config = config or CompressionConfig()
    counts = turn_token_counts(record.turns, counter)
    total = sum(counts)
    unchanged = CompressionMetrics(total, total, len(record.turns), len(record.turns))
    if total <= config.target_max_tokens:
        return CompressionResult(record, replace(unchanged, skipped_reason=UNDER_BUDGET))
    span = plan_span(record.turns, counts, config)
    if span is None:
        return CompressionResult(record, replace(unchanged, still_over_limit=True, skipped_reason=NOTHING_TO_COMPRESS))
    start, end = span
    try:
        summary = summarizer.summarize(record.turns[start:end], config.summary_target_tokens)
    except Exception as error:  # whatever the summariser's failure, the record must survive it
        return _failed(record, unchanged, f"{type(error).__name__}: {error}")
    summary_value = fit_to_token_budget(SUMMARY_PREFIX + summary.strip(), counter, config.summary_target_tokens)
    if len(summary_value) <= len(SUMMARY_PREFIX):
        return _failed(record, unchanged, "the summary is empty or summary_target_tokens cannot hold it")
    summary_tokens = counter.count(summary_value)
    compressed_tokens = total - sum(counts[start:end]) + summary_tokens
    if compressed_tokens >= total:
        metrics = replace(unchanged, still_over_limit=True, skipped_reason=NO_SAVINGS, summarization_calls=1)
        return CompressionResult(record, metrics)
    turns = (*record.turns[:start], Turn(role=SUMMARY_ROLE, value=summary_value), *record.turns[end:])
    metrics = CompressionMetrics(
        original_tokens=total,
        compressed_tokens=compressed_tokens,
        original_turns=len(record.turns),
        compressed_turns=len(turns),
        turns_removed=end - start,
        summary_tokens=summary_tokens,
        was_compressed=True,
        still_over_limit=compressed_tokens > config.target_max_tokens,
        summarization_calls=1,
    )
    return CompressionResult(replace(record, turns=turns), metrics)


def _failed(record: TrajectoryRecord, unchanged: CompressionMetrics, error: str) -> CompressionResult:
    metrics = replace(
        unchanged,
        still_over_limit=True,
        skipped_reason=SUMMARIZATION_FAILED,
        summarization_calls=1,
        summarization_errors=1,
        error=error,
    )
    return CompressionResult(record, metrics)


@dataclass
class CompressionStats:
    """Streaming aggregate over a compression pass."""

    records: int = 0
    compressed: int = 0
    still_over_limit: int = 0
    original_tokens: int = 0
    compressed_tokens: int = 0
    turns_removed: int = 0
    summarization_calls: int = 0
    summarization_errors: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    _ratio_sum: float = 0.0

    def add(self, metrics: CompressionMetrics) -> None:
        self.records += 1
        self.compressed += metrics.was_compressed
        self.still_over_limit += metrics.still_over_limit
        self.original_tokens += metrics.original_tokens
        self.compressed_tokens += metrics.compressed_tokens
        self.turns_removed += metrics.turns_removed
        self.summarization_calls += metrics.summarization_calls
        self.summarization_errors += metrics.summarization_errors
        if metrics.skipped_reason:
            self.skipped[metrics.skipped_reason] += 1
        if metrics.was_compressed:
            self._ratio_sum += metrics.compression_ratio

    def as_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "compressed": self.compressed,
            "skipped": dict(sorted(self.skipped.items())),
            "still_over_limit": self.still_over_limit,
            "original_tokens": self.original_tokens,
            "compressed_tokens": self.compressed_tokens,
            "tokens_saved": self.original_tokens - self.compressed_tokens,
            "overall_ratio": self.compressed_tokens / self.original_tokens if self.original_tokens else None,
            "mean_ratio_of_compressed": self._ratio_sum / self.compressed if self.compressed else None,
            "turns_removed": self.turns_removed,
            "summarization_calls": self.summarization_calls,
            "summarization_errors": self.summarization_errors,
        }
