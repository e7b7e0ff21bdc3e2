"""Writes one dataset: records streamed into a staging directory with their statistics, then committed whole
(files renamed into place, then the database row). Used by uploads, derived datasets and collections."""

from __future__ import annotations

import math
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from rlctl.service.datasets.store import DatasetFiles, DatasetStore, IndexedJsonlWriter, write_json_atomically
from rlctl.service.datasets.tokenizers import MemoCounter
from rlctl.service.db.models import Dataset
from rlctl.service.db.types import utcnow
from rlctl.trajectories.records import TrajectoryRecord, record_to_dict
from rlctl.trajectories.stats import DatasetStats, compute_record_stats, record_stats_fields
from rlctl.trajectories.tokens import TokenCounter


def new_dataset_id() -> str:
    return "ds" + uuid.uuid4().hex[:14]


class RunningSummary:
    """Count, mean, standard deviation, min and max of any numbers (rewards may be negative)."""

    def __init__(self) -> None:
        self.count, self._mean, self._m2 = 0, 0.0, 0.0
        self.minimum: float | None = None
        self.maximum: float | None = None

    def add(self, value: float) -> None:
        self.count += 1
        delta = value - self._mean
        self._mean += delta / self.count
        self._m2 += delta * (value - self._mean)
        self.minimum = value if self.minimum is None else min(self.minimum, value)
        self.maximum = value if self.maximum is None else max(self.maximum, value)

    def as_dict(self) -> dict[str, Any]:
        if not self.count:
            return {"count": 0, "mean": None, "std": None, "min": None, "max": None}
        return {
            "count": self.count,
            "mean": self._mean,
            "std": math.sqrt(self._m2 / self.count),
            "min": self.minimum,
            "max": self.maximum,
        }


class DatasetBuilder:
    """Append records, then `finish` (commit) or `abort` (nothing stays behind)."""

    def __init__(
        self, store: DatasetStore, token: str, counter: TokenCounter, stats: dict[str, Any] | None = None
    ) -> None:
        self.store = store
        self.staged: DatasetFiles = store.staging(token)
        self.writer = IndexedJsonlWriter(self.staged.records, self.staged.index)
        self.counter = counter if isinstance(counter, MemoCounter) else MemoCounter(counter)
        self._fixed_stats = stats  # given when the records' turns are the parent's (scoring)
        self.stats = DatasetStats()
        self.formats: Counter[str] = Counter()
        self.rewards = RunningSummary()
        self._metrics: IndexedJsonlWriter | None = None

    @property
    def count(self) -> int:
        return self.writer.count

    def add(self, record: TrajectoryRecord) -> None:
        if self._fixed_stats is None:
            self.stats.add(compute_record_stats(record, self.counter))
        self.counter.forget()
        self.formats[record.source_format] += 1
        if record.reward is not None:
            self.rewards.add(record.reward)
        self.writer.write({**record_to_dict(record), **record_stats_fields(record)})

    def add_metrics(self, metrics: dict[str, Any]) -> None:
        """Per-record metrics of the operation (compression), paged like the records."""
        if self._metrics is None:
            self._metrics = IndexedJsonlWriter(self.staged.compression, self.staged.compression_index)
        self._metrics.write(metrics)

    def statistics(self) -> dict[str, Any]:
        if self._fixed_stats is not None:
            stats = dict(self._fixed_stats)
        else:
            stats = self.stats.as_dict()
            reasoning = stats["reasoning_stats"]
            reasoning["coverage"] = reasoning["records_with_reasoning"] / stats["records"] if stats["records"] else None
            stats["token_counter"] = self.counter.name
        stats["source_formats"] = dict(sorted(self.formats.items()))
        stats["rewards"] = self.rewards.as_dict()
        return stats

    def finish(
        self,
        session_factory: Any,
        dataset_id: str,
        *,
        name: str,
        operation: str,
        parent_id: str | None = None,
        parameters: dict[str, Any] | None = None,
        source_format: str | None = None,
        report: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Commit the files, then the row; returns the row's fields. `session_factory` is `Database.session`."""
        self.writer.close()
        if self._metrics is not None:
            self._metrics.close()
        meta = {
            "id": dataset_id,
            "name": name,
            "parent_id": parent_id,
            "operation": operation,
            "parameters": parameters or {},
            "source_format": source_format,
            "record_count": self.writer.count,
            "byte_size": self.writer.bytes,
            "stats": self.statistics(),
            "report": report or {},
            "created_at": utcnow().isoformat(),
        }
        write_json_atomically(self.staged.meta, meta)
        self.store.commit(self.staged, dataset_id)
        return insert_dataset_row(session_factory, meta)

    def abort(self) -> None:
        self.writer.abort()
        if self._metrics is not None:
            self._metrics.abort()
        self.store.discard(self.staged)


def insert_dataset_row(session_factory: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """The row of a committed dataset (from its meta.json), unless it is already there."""
    with session_factory() as session:
        if session.get(Dataset, meta["id"]) is None:
            fields = {key: value for key, value in meta.items() if key != "created_at"}
            session.add(Dataset(**fields, status="ready", created_at=datetime.fromisoformat(meta["created_at"])))
    return {**meta, "status": "ready", "created_at": datetime.fromisoformat(meta["created_at"]).astimezone(UTC)}
