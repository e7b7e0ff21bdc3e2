"""A records file's prompts as groups, for the rewards decided per group and for whatever else groups a dataset's
records by prompt (GRPO export, a run's split). A records file holds one stored record per line
(rlctl/trajectories/records.py); a record is found again by its line's byte offset, so a group is held as offsets, not
records, and memory stays bounded by one sort run of keys whatever the file's size.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from rlctl.service.jobs.passes import NO_PROGRESS, Progress
from rlctl.trajectories.grpo import group_key
from rlctl.trajectories.records import TrajectoryRecord, record_from_dict

SORT_RUN_ENTRIES = 200_000  # (key, offset) pairs sorted in memory before spilling to disk (~20 MB)


def records_with_offsets(records: Path) -> Iterator[tuple[int, TrajectoryRecord]]:
    """Every record of the file with the byte offset of its line, in file order."""
    offset = 0
    with records.open("rb") as handle:
        for raw in handle:
            yield offset, record_from_dict(json.loads(raw.decode("utf-8")))
            offset += len(raw)


def record_at(handle: IO[bytes], offset: int) -> TrajectoryRecord:
    """The record whose line starts at `offset` of an open records file."""
    handle.seek(offset)
    return record_from_dict(json.loads(handle.readline().decode("utf-8")))


def sorted_group_keys(
    records: Path, group_by: str | None, scratch: Path, progress: Progress = NO_PROGRESS
) -> tuple[Iterator[tuple[str, int]], int]:
    """(group key, byte offset) of every record, sorted by key through runs spilled to `scratch`; and the count
    of records without a prompt."""
    runs: list[Path] = []
    buffer: list[tuple[str, int]] = []
    unkeyed = 0
    for done, (offset, record) in enumerate(records_with_offsets(records), start=1):
        key = group_key(record, group_by)
        if key is None:
            unkeyed += 1
        else:
            buffer.append((key, offset))
        if len(buffer) >= SORT_RUN_ENTRIES:
            runs.append(_spill(sorted(buffer), scratch, len(runs)))
            buffer = []
        progress.progress(done // 2)  # sorting is about half the work
        progress.check_cancelled()
    buffer.sort()
    return heapq.merge(*(_read_run(path) for path in runs), iter(buffer)), unkeyed


def _spill(pairs: list[tuple[str, int]], scratch: Path, number: int) -> Path:
    path = scratch / f"run-{number}.tsv"
    with path.open("w", encoding="ascii") as handle:
        handle.writelines(f"{key}\t{offset}\n" for key, offset in pairs)
    return path


def _read_run(path: Path) -> Iterator[tuple[str, int]]:
    with path.open(encoding="ascii") as handle:
        for line in handle:
            key, _, offset = line.rstrip("\n").partition("\t")
            yield key, int(offset)
