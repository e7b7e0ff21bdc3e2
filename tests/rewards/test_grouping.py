"""A records file's prompts as groups: keys sorted through runs spilled to disk, records read back by offset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.service.rewards import grouping
from rlctl.service.rewards.grouping import record_at, records_with_offsets, sorted_group_keys
from rlctl.trajectories.grpo import group_key
from rlctl.trajectories.records import TrajectoryRecord, Turn, record_to_dict


def record(prompt: str | None, answer: str) -> TrajectoryRecord:
    turns = ((Turn("human", prompt),) if prompt is not None else ()) + (Turn("gpt", answer),)
    return TrajectoryRecord(turns=turns, metadata={"answer": "é"})  # a non-ASCII line: offsets count bytes


def write_records(path: Path, records: list[TrajectoryRecord]) -> Path:
    with path.open("w", encoding="utf-8") as out:
        out.writelines(json.dumps(record_to_dict(r), ensure_ascii=False) + "\n" for r in records)
    return path


RECORDS = [record(prompt, f"answer {i}") for i, prompt in enumerate(["b", "a", None, "c", "a", "b", "a", None])]


@pytest.mark.parametrize("run_entries", [2, 1000])  # spilled in runs of two, or sorted in memory
def test_keys_are_sorted_and_read_back_by_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_entries: int
) -> None:
    monkeypatch.setattr(grouping, "SORT_RUN_ENTRIES", run_entries)
    records = write_records(tmp_path / "records.jsonl", RECORDS)
    pairs, unkeyed = sorted_group_keys(records, None, tmp_path)
    pairs = list(pairs)
    assert unkeyed == 2
    keys = [key for key, _ in pairs]
    assert keys == sorted(keys) and len(keys) == 6
    assert len(list(tmp_path.glob("run-*.tsv"))) == (3 if run_entries == 2 else 0)
    with records.open("rb") as handle:
        read_back = [(key, record_at(handle, offset)) for key, offset in pairs]
    assert all(group_key(found) == key for key, found in read_back)
    assert sorted(r.turns[-1].value for _, r in read_back) == sorted(
        r.turns[-1].value for r in RECORDS if r.turns[0].role == "human"
    )


def test_offsets_are_the_lines_byte_offsets(tmp_path: Path) -> None:
    records = write_records(tmp_path / "records.jsonl", RECORDS)
    with records.open("rb") as handle:
        for offset, found in records_with_offsets(records):
            assert record_at(handle, offset) == found
    assert [r for _, r in records_with_offsets(records)] == RECORDS
