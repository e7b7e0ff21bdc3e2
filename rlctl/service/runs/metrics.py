"""Metrics of a run: read from the append-only files its processes write, stored in the database."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from rlctl.service.db.models import RunMetric
from rlctl.service.runs.paths import RunPaths

logger = logging.getLogger("rlctl.runs.metrics")
MAX_READ_BYTES = 8 * 1024 * 1024


@dataclass
class FileCursor:
    """How far a metrics file has been read (whole lines only)."""

    offset: int = 0


@dataclass
class MetricsCursors:
    trainer: FileCursor = field(default_factory=FileCursor)
    env: FileCursor = field(default_factory=FileCursor)


def read_new_entries(path: Path, cursor: FileCursor) -> list[dict[str, Any]]:
    """Complete JSON lines appended since the cursor; a trailing partial line waits for its end."""
    try:
        with path.open("rb") as handle:
            handle.seek(cursor.offset)
            data = handle.read(MAX_READ_BYTES)
    except OSError:
        return []
    end = data.rfind(b"\n")
    if end < 0:
        return []
    cursor.offset += end + 1
    entries = []
    for line in data[: end + 1].splitlines():
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            logger.warning("skipping a malformed metrics line in %s", path)
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def metric_rows(entry: dict[str, Any]) -> list[tuple[str, int, float]]:
    """(name, step, value) for each finite number of a `{"step", "metrics": {...}}` entry."""
    step, metrics = entry.get("step"), entry.get("metrics")
    if not isinstance(step, int) or isinstance(step, bool) or not isinstance(metrics, dict):
        return []
    rows = []
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            continue
        rows.append((str(name)[:128], step, float(value)))
    return rows


def ingest(session: Session, paths: RunPaths, cursors: MetricsCursors) -> int | None:
    """Store what the trainer and environment appended since last time; returns the newest trainer step."""
    trainer_entries = read_new_entries(paths.metrics, cursors.trainer)
    env_entries = read_new_entries(paths.env_metrics, cursors.env)
    rows = [row for entry in trainer_entries for row in metric_rows(entry)]
    rows += [row for entry in env_entries for row in metric_rows(entry)]
    upsert_metrics(session, paths.run_id, rows)
    steps = [e["step"] for e in trainer_entries if isinstance(e.get("step"), int) and e.get("metrics")]
    return max(steps) if steps else None


def upsert_metrics(session: Session, run_id: str, rows: list[tuple[str, int, float]]) -> None:
    """One statement, executed with every row's values: SQLAlchemy compiles it once and sends the rows in
    batches of many VALUES (its "insertmanyvalues"). A statement with the rows' values written into it was compiled
    anew at every call: 31 ms of CPU for a second of a fast run's metrics (540 rows) on SQLite against 4 ms."""
    if not rows:
        return
    latest: dict[tuple[str, int], float] = {}
    for name, step, value in rows:
        latest[(name, step)] = value  # a value logged twice at one step: the later one counts
    values = [{"run_id": run_id, "name": n, "step": s, "value": v} for (n, s), v in latest.items()]
    dialect = session.get_bind().dialect.name
    statement = (postgresql_insert if dialect == "postgresql" else sqlite_insert)(RunMetric)
    statement = statement.on_conflict_do_update(
        index_elements=["run_id", "name", "step"], set_={"value": statement.excluded.value}
    )
    session.execute(statement, values)


def latest_values(session: Session, run_id: str) -> dict[str, tuple[int, float]]:
    """name → (step, value) of the newest step of each metric."""
    newest = (
        select(RunMetric.name, func.max(RunMetric.step).label("step"))
        .where(RunMetric.run_id == run_id)
        .group_by(RunMetric.name)
        .subquery()
    )
    rows = session.execute(
        select(RunMetric.name, RunMetric.step, RunMetric.value)
        .join(newest, (RunMetric.name == newest.c.name) & (RunMetric.step == newest.c.step))
        .where(RunMetric.run_id == run_id)
    )
    return {name: (step, value) for name, step, value in rows}


def history(
    session: Session,
    run_id: str,
    names: list[str] | None = None,
    min_step: int | None = None,
    max_step: int | None = None,
) -> dict[str, list[list[float]]]:
    query = select(RunMetric.name, RunMetric.step, RunMetric.value).where(RunMetric.run_id == run_id)
    if names:
        query = query.where(RunMetric.name.in_(names))
    if min_step is not None:
        query = query.where(RunMetric.step >= min_step)
    if max_step is not None:
        query = query.where(RunMetric.step <= max_step)
    series: dict[str, list[list[float]]] = {}
    for name, step, value in session.execute(query.order_by(RunMetric.name, RunMetric.step)):
        series.setdefault(name, []).append([step, value])
    return series
