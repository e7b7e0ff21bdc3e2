"""Runs written straight into the real database and data directory, in the shapes the supervisor writes them:
for tests of read-only views (the page, the metrics) that need a run in a given state without training one."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from rlctl.service.db import migrate
from rlctl.service.db.engine import Database
from rlctl.service.db.models import Run, RunProcess
from rlctl.service.db.types import utcnow
from rlctl.service.runs.metrics import upsert_metrics
from rlctl.service.runs.paths import ROLES, RunPaths
from rlctl.service.settings import Settings


@dataclass
class SeededRun:
    status: str = "completed"
    environment: str = "echo"
    total_steps: int = 6
    series: dict[str, list[float]] = field(default_factory=dict)  # metric name → values of steps 1, 2, ...
    process_status: str = "exited"
    stalled: bool = False
    # Another replica's, heartbeating: a service under test leaves such runs alone (no re-adoption, no sweep).
    owner_id: str = "another-replica"
    logs: dict[str, str] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    backend: str = "local"
    config: dict[str, Any] = field(default_factory=dict)  # merged into {"tinker": {"total_steps": ...}}


def seed_run(settings: Settings, seeded: SeededRun) -> SeededRun:
    db = Database(settings.sqlalchemy_url)
    now = utcnow()
    last_step = max((len(values) for values in seeded.series.values()), default=0) or None
    try:
        migrate.upgrade(db)  # idempotent: seeding may come before the service's first start
        with db.session() as session:
            session.add(
                Run(
                    id=seeded.id,
                    environment=seeded.environment,
                    backend=seeded.backend,
                    status=seeded.status,
                    config={
                        **seeded.config,
                        "tinker": {"total_steps": seeded.total_steps, **seeded.config.get("tinker", {})},
                    },
                    last_step=last_step,
                    stalled=seeded.stalled,
                    owner_id=seeded.owner_id,
                    heartbeat_at=now,
                    ports={"api": 1, "inference": 2},
                    created_at=now - timedelta(minutes=5),
                    started_at=now - timedelta(minutes=4),
                    ended_at=now if seeded.status in ("completed", "stopped", "failed") else None,
                )
            )
            session.flush()
            for role in ROLES:
                session.add(
                    RunProcess(run_id=seeded.id, role=role, status=seeded.process_status, exit_code=0, started_at=now)
                )
            rows = [(name, step, v) for name, values in seeded.series.items() for step, v in enumerate(values, 1)]
            upsert_metrics(session, seeded.id, rows)
    finally:
        db.dispose()
    paths = RunPaths(settings.data_path, seeded.id)
    for role, text in seeded.logs.items():
        paths.log(role).parent.mkdir(parents=True, exist_ok=True)
        paths.log(role).write_text(text)
    return seeded


def record_step(settings: Settings, run_id: str, step: int, values: dict[str, float]) -> None:
    """A new training step of a seeded run, as the supervisor's ingestion records it."""
    db = Database(settings.sqlalchemy_url)
    try:
        with db.session() as session:
            upsert_metrics(session, run_id, [(name, step, value) for name, value in values.items()])
            session.get(Run, run_id).last_step = step  # type: ignore[union-attr]
    finally:
        db.dispose()
