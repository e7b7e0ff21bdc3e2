"""Compression to a token budget: invariants on every real record, the reference's defects, and properties."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.trajectories.compression import (
    NO_SAVINGS,
    NOTHING_TO_COMPRESS,
    SUMMARIZATION_FAILED,
    SUMMARY_PREFIX,
    UNDER_BUDGET,
    CompressionConfig,
    CompressionResult,
    CompressionStats,
    compress_record,
    exchange_blocks,
    protected_turns,
)
from rlctl.trajectories.convert import TurnBuilder
from rlctl.trajectories.records import TrajectoryRecord, Turn
from rlctl.trajectories.summarizers import ExtractiveSummarizer
from rlctl.trajectories.tokens import ApproximateTokenCounter, TokenCounter, turn_token_counts

COUNTER = ApproximateTokenCounter()


@dataclass
class FixedSummarizer:
    """Returns the same text for any span (stands in deterministically for a model writing long summaries)."""

    text: str
    name: str = "fixed"

    def summarize(self, turns: Sequence[Turn], target_tokens: int) -> str:
        return self.text


def words(count: int) -> str:
    return " ".join(["word"] * count)  # one token per word for the fallback counter


def assert_compression_invariants(
    original: TrajectoryRecord, result: CompressionResult, config: CompressionConfig, counter: TokenCounter
) -> None:
    metrics, turns = result.metrics, result.record.turns
    assert metrics.compressed_tokens <= metrics.original_tokens, "never longer"
    assert sum(turn_token_counts(turns, counter)) == metrics.compressed_tokens
    assert metrics.still_over_limit == (metrics.compressed_tokens > config.target_max_tokens)
    if not metrics.was_compressed:
        assert result.record == original
        return
    start, removed = _summary_position(original, result)
    assert removed == metrics.turns_removed >= 1
    assert turns[:start] == original.turns[:start] and turns[start + 1 :] == original.turns[start + removed :]
    protected = protected_turns(original.turns, config)
    assert not protected & set(range(start, start + removed)), "a protected turn was summarised"
    tail = config.protect_last_n_turns
    assert not tail or turns[-tail:] == original.turns[-tail:]
    assert counter.count(turns[start].value) <= config.summary_target_tokens
    _assert_exchanges_whole(original, start, removed)
    _assert_fewest_exchanges(original, start, removed, config, counter)


def _summary_position(original: TrajectoryRecord, result: CompressionResult) -> tuple[int, int]:
    turns = result.record.turns
    [start] = [i for i, t in enumerate(turns) if t.role == "human" and t.value.startswith(SUMMARY_PREFIX)]
    return start, len(original.turns) - len(turns) + 1


def _assert_exchanges_whole(original: TrajectoryRecord, start: int, removed: int) -> None:
    """Checked from ids alone (not with the compressor's own grouping): a call and its results go together."""
    span = range(start, start + removed)
    latest_call_at: dict[str, int] = {}  # tau-bench reuses ids: a result answers the latest earlier call
    for index, turn in enumerate(original.turns):
        latest_call_at.update((call.id, index) for call in turn.tool_calls)
        if turn.role == "tool" and turn.tool_call_id in latest_call_at:
            call_index = latest_call_at[turn.tool_call_id]
            assert (index in span) == (call_index in span), "a call was cut from its result"


def _assert_fewest_exchanges(
    original: TrajectoryRecord, start: int, removed: int, config: CompressionConfig, counter: TokenCounter
) -> None:
    counts = turn_token_counts(original.turns, counter)
    needed = sum(counts) - config.target_max_tokens + config.summary_target_tokens
    blocks = [b for b in exchange_blocks(original.turns) if start <= b[0] and b[1] <= start + removed]
    without_last = sum(counts[start : blocks[-1][0]])
    assert without_last < needed, "the span is longer than it needs to be"


def compress(record: TrajectoryRecord, config: CompressionConfig, counter: TokenCounter = COUNTER):
    result = compress_record(record, counter, ExtractiveSummarizer(), config)
    assert_compression_invariants(record, result, config, counter)
    return result


def test_every_real_record_keeps_the_invariants_under_a_tight_budget(all_real_records) -> None:
    config = CompressionConfig(target_max_tokens=3000, summary_target_tokens=300)
    stats = CompressionStats()
    for _, record in all_real_records:
        stats.add(compress(record, config).metrics)
    summary = stats.as_dict()
    assert summary["records"] == len(all_real_records)
    assert summary["compressed"] >= 15 and summary["tokens_saved"] > 0  # 20 of the 56 excerpt records are over
    assert summary["summarization_errors"] == 0
    assert summary["compressed"] + sum(summary["skipped"].values()) == summary["records"]


def test_real_long_records_fit_the_default_budget_with_a_real_tokenizer(all_real_records, hf_counter) -> None:
    config = CompressionConfig()
    long_records = [(n, r) for n, r in all_real_records if sum(turn_token_counts(r.turns, COUNTER)) > 14_000]
    assert len(long_records) >= 6
    compressed = 0
    for name, record in long_records:
        result = compress(record, config, hf_counter)
        compressed += result.metrics.was_compressed
        if result.metrics.was_compressed and not result.metrics.still_over_limit:
            assert result.metrics.compressed_tokens <= config.target_max_tokens, name
    assert compressed >= len(long_records) - 2


def test_the_longest_openhands_run_is_brought_under_budget(real_records) -> None:
    record = real_records["openhands-multi-swe-bench-output.jsonl"][1]  # ponyc-4588, 103 events
    result = compress(record, CompressionConfig())
    assert result.metrics.was_compressed and not result.metrics.still_over_limit
    assert result.metrics.original_tokens > 30_000
    assert result.record.metadata == record.metadata


def test_records_under_budget_are_untouched_and_need_no_summary(real_records) -> None:
    record = real_records["tau-bench-gpt-4o-airline.json"][0]
    result = compress_record(record, COUNTER, FixedSummarizer("never used"), CompressionConfig())
    assert result.record is record and result.metrics.skipped_reason == UNDER_BUDGET
    assert result.metrics.summarization_calls == 0


def agent_record(sizes: Sequence[tuple[str, int]]) -> TrajectoryRecord:
    """Builds a record from (kind, size) steps; a "call" step adds a gpt call turn and its tool result."""
    builder = TurnBuilder()
    for index, (kind, size) in enumerate(sizes):
        if kind in ("system", "human"):
            builder.add_text(kind, words(size))
        elif kind == "text":
            builder.add_assistant(words(size))
        elif kind == "call":
            builder.add_assistant("", None, [(f"c{index}", "bash", {"cmd": "ls"})])
            builder.add_tool_result(words(size), call_id=f"c{index}")
    return TrajectoryRecord(turns=builder.build())


def test_a_short_record_over_budget_is_still_compressed() -> None:
    # 10 turns: system, human, 4 call/result exchanges; the big result sits in the one unprotected exchange.
    record = agent_record([("system", 50), ("human", 50), ("call", 50), ("call", 3000), ("call", 50), ("call", 50)])
    assert len(record.turns) == 10
    result = compress(record, CompressionConfig(target_max_tokens=1000, summary_target_tokens=100))
    assert result.metrics.was_compressed and not result.metrics.still_over_limit
    assert result.metrics.turns_removed == 2


def test_a_short_record_whose_first_tool_turn_is_in_its_second_half_is_compressed() -> None:
    """A head/tail split at the middle of the record took the first tool result for part of the tail: it then
    summarised the turns before it (cutting that call from its result) and never reached the large exchange
    after it, so the record stayed over budget."""
    steps = [("system", 20), ("human", 20), ("text", 20), ("human", 20), ("text", 20), ("human", 20)]
    steps += [("call", 20), ("call", 4000), ("text", 20), ("human", 20), ("text", 20), ("human", 20)]
    record = agent_record(steps)
    assert len(record.turns) == 14 and record.turns[7].role == "tool"
    result = compress(record, CompressionConfig(target_max_tokens=1500, summary_target_tokens=100))
    assert result.metrics.was_compressed and not result.metrics.still_over_limit
    assert result.record.turns[6:8] == record.turns[6:8]  # the first tool exchange is protected, whole


def test_a_record_whose_bulk_is_protected_is_reported_not_silently_passed() -> None:
    record = agent_record([("system", 5000), ("human", 10), ("call", 10), ("text", 10)])
    result = compress_record(record, COUNTER, ExtractiveSummarizer(), CompressionConfig(target_max_tokens=1000))
    assert result.record is record
    assert result.metrics.skipped_reason == NOTHING_TO_COMPRESS and result.metrics.still_over_limit


def test_a_summary_that_would_not_save_tokens_is_discarded() -> None:
    record = agent_record([("system", 600), ("human", 10), ("call", 10), ("text", 30), ("call", 10), ("text", 10)])
    config = CompressionConfig(target_max_tokens=640, summary_target_tokens=400, protect_last_n_turns=2)
    result = compress_record(record, COUNTER, FixedSummarizer(words(1000)), config)
    assert result.record is record
    assert result.metrics.skipped_reason == NO_SAVINGS and result.metrics.summarization_calls == 1
    assert result.metrics.compressed_tokens == result.metrics.original_tokens


def test_only_as_much_as_needed_is_summarised(real_records) -> None:
    record = real_records["nemo-gym-anyterminal-hermes-rollouts.jsonl"][1]  # 90 tool calls
    total = sum(turn_token_counts(record.turns, COUNTER))
    slightly = compress(record, CompressionConfig(target_max_tokens=total - 2000, summary_target_tokens=200))
    heavily = compress(record, CompressionConfig(target_max_tokens=total // 4, summary_target_tokens=200))
    assert 0 < slightly.metrics.turns_removed < heavily.metrics.turns_removed
    assert slightly.metrics.compressed_tokens > heavily.metrics.compressed_tokens


@dataclass
class BrokenSummarizer:
    error: Exception
    name: str = "broken"

    def summarize(self, turns: Sequence[Turn], target_tokens: int) -> str:
        raise self.error


@pytest.mark.parametrize("summary", [BrokenSummarizer(TimeoutError("took too long")), FixedSummarizer("   ")])
def test_a_failed_summary_keeps_the_record_and_is_counted(real_records, summary) -> None:
    record = real_records["openhands-multi-swe-bench-output.jsonl"][0]
    result = compress_record(record, COUNTER, summary, CompressionConfig())
    assert result.record is record
    assert result.metrics.skipped_reason == SUMMARIZATION_FAILED and result.metrics.summarization_errors == 1
    assert result.metrics.error
    stats = CompressionStats()
    stats.add(result.metrics)
    assert stats.as_dict()["summarization_errors"] == 1 and stats.as_dict()["records"] == 1


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        CompressionConfig(target_max_tokens=0)
    with pytest.raises(ValueError):
        CompressionConfig(protect_last_n_turns=-1)


step = st.one_of(
    st.tuples(st.just("human"), st.integers(1, 400)),
    st.tuples(st.just("text"), st.integers(1, 400)),
    st.tuples(st.just("call"), st.integers(1, 900)),
    st.tuples(st.just("multi"), st.integers(1, 300), st.integers(0, 3)),
)


def random_record(steps: list[tuple]) -> TrajectoryRecord:
    builder = TurnBuilder()
    builder.add_text("system", words(30))
    builder.add_text("human", words(30))
    for index, item in enumerate(steps):
        kind, size = item[0], item[1]
        if kind in ("human", "text"):
            (builder.add_text("human", words(size)) if kind == "human" else builder.add_assistant(words(size)))
        elif kind == "call":
            builder.add_assistant(words(5), None, [(f"c{index}", "bash", {})])
            builder.add_tool_result(words(size), call_id=f"c{index}")
        else:  # several calls, some of them never answered
            calls = [(f"m{index}_{k}", "read", {"k": k}) for k in range(3)]
            builder.add_assistant("", "thinking " + words(3), calls)
            for call_id, _, _ in calls[: item[2]]:
                builder.add_tool_result(words(size), call_id=call_id)
    return TrajectoryRecord(turns=builder.build())


@settings(max_examples=150, deadline=None)
@given(
    st.lists(step, min_size=0, max_size=25),
    st.integers(50, 6000),
    st.integers(10, 500),
    st.integers(0, 6),
    st.booleans(),
)
def test_compression_invariants_hold_for_any_trajectory(steps, target, summary_target, tail, protect_tool) -> None:
    record = random_record(steps)
    config = CompressionConfig(
        target_max_tokens=target,
        summary_target_tokens=summary_target,
        protect_last_n_turns=tail,
        protect_first_tool=protect_tool,
    )
    result = compress(record, config)
    if result.metrics.skipped_reason is None:
        assert result.metrics.was_compressed
