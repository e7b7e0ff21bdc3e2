"""End to end on every real file: ingest → stats → filter → compress → score → store → re-read → GRPO export,
one record at a time, as the service's jobs will run it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlctl.trajectories.compression import CompressionConfig, CompressionStats, compress_record
from rlctl.trajectories.filters import FilterCriteria, FilterReport, drop_reasons
from rlctl.trajectories.grpo import GroupIssue, GrpoExportStats, GrpoGroup, group_key, grpo_groups
from rlctl.trajectories.importing import ImportedRecord, import_items
from rlctl.trajectories.reading import ItemError, read_items
from rlctl.trajectories.records import record_to_dict
from rlctl.trajectories.rewards import FormatReward, SourceReward, WeightedReward, scored
from rlctl.trajectories.stats import DatasetStats, compute_record_stats
from rlctl.trajectories.summarizers import ExtractiveSummarizer
from rlctl.trajectories.tokens import ApproximateTokenCounter
from tests.datasets.realdata import EXPECTED_FILES

REWARDS = [WeightedReward(FormatReward()), WeightedReward(SourceReward())]


@pytest.mark.parametrize("name", sorted(EXPECTED_FILES))
def test_real_file_through_the_whole_pipeline(trajectories_dir: Path, name: str) -> None:
    counter = ApproximateTokenCounter()
    config = CompressionConfig(target_max_tokens=8000, summary_target_tokens=400)
    stats, filtering, compression = DatasetStats(), FilterReport(), CompressionStats()
    stored: list[str] = []
    with (trajectories_dir / name).open(encoding="utf-8") as lines:
        for outcome in import_items(read_items(lines)):
            assert isinstance(outcome, ImportedRecord), outcome
            record = outcome.record
            stats.add(compute_record_stats(record, counter))
            filtering.add(drop_reasons(record, FilterCriteria(max_tokens=1_000_000), counter))
            result = compress_record(record, counter, ExtractiveSummarizer(), config)
            compression.add(result.metrics)
            stored.append(json.dumps(record_to_dict(scored(result.record, REWARDS)), ensure_ascii=False))

    expected_count = EXPECTED_FILES[name][1]
    assert stats.records == filtering.kept == compression.records == len(stored) == expected_count
    assert compression.as_dict()["tokens_saved"] >= 0 and compression.summarization_errors == 0

    reread = [o.record for o in import_items(read_items(stored)) if isinstance(o, ImportedRecord)]
    assert [json.dumps(record_to_dict(r), ensure_ascii=False) for r in reread] == stored
    assert all(r.reward is not None and set(r.reward_breakdown or {}) == {"format", "source_reward"} for r in reread)

    pairs = sorted(((group_key(r), r) for r in reread), key=lambda pair: pair[0] or "")
    export = GrpoExportStats()
    lines_out = []
    for outcome in grpo_groups(pairs):
        export.add(outcome)
        if isinstance(outcome, GrpoGroup):
            lines_out.append(json.dumps(outcome.as_dict(), ensure_ascii=False))
        else:
            assert isinstance(outcome, GroupIssue) and outcome.reason in ("too_small", "no_prompt")
    assert export.records + export.records_in_issues == expected_count
    assert all(json.loads(line)["size"] >= 2 for line in lines_out)


def test_import_is_lazy_one_json_line_at_a_time() -> None:
    message = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}

    def lines() -> Iterator[str]:
        yield json.dumps(message) + "\n"
        raise AssertionError("read past the first record before it was asked for")

    outcomes = import_items(read_items(lines()))
    assert isinstance(next(outcomes), ImportedRecord)


def test_import_is_lazy_one_array_element_at_a_time() -> None:
    record = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}

    def lines() -> Iterator[str]:
        yield "[\n"
        yield json.dumps(record) + ",\n"
        raise AssertionError("read past the first element before it was asked for")

    outcomes = import_items(read_items(lines()))
    first = next(outcomes)
    assert isinstance(first, ImportedRecord) and first.line == 2


def test_a_whole_file_with_bad_lines_reports_them_and_imports_the_rest(trajectories_dir: Path) -> None:
    lines = (trajectories_dir / "nemo-gym-xlam-fc-rollouts.jsonl").read_text(encoding="utf-8").splitlines()
    lines.insert(2, lines[2][: len(lines[2]) // 2])  # a line cut in half, as from an interrupted upload
    outcomes = list(import_items(read_items(lines)))
    assert [o.line for o in outcomes if isinstance(o, ItemError)] == [3]
    assert len([o for o in outcomes if isinstance(o, ImportedRecord)]) == 5
