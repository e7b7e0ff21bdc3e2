"""State gauges read from the database at scrape time, so every replica reports the same totals and they
survive restarts: runs by state, supervised processes, jobs by kind and state, status checks allowed/limited."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from rlctl.service.db.engine import Database
from rlctl.service.db.models import Job, Run, RunProcess, StatusCheck
from rlctl.service.states import RUN_ACTIVE, JobStatus, ProcessStatus, RunStatus

logger = logging.getLogger("rlctl.monitoring")
PROCESS_ROLES = ("api", "trainer", "env")
PROCESS_STATES = (ProcessStatus.PENDING, ProcessStatus.RUNNING, ProcessStatus.EXITED)  # as recorded


class DatabaseStateCollector(Collector):
    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("rlctl_database_up", "1 when the database answered this scrape.")
        try:
            with self.db.session() as session:
                metrics = list(_state_metrics(session))
        except SQLAlchemyError as exc:
            logger.warning("metrics scrape: database unavailable (%s)", type(exc).__name__)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from metrics


def _state_metrics(session: Session) -> Iterator[Metric]:
    runs = GaugeMetricFamily("rlctl_runs", "Runs by state (all replicas).", labels=["status"])
    counts = dict(session.execute(select(Run.status, func.count()).group_by(Run.status)).all())
    for status in sorted(set(RunStatus) | set(counts)):
        runs.add_metric([status], counts.get(status, 0))
    yield runs

    stalled = session.scalar(select(func.count()).where(Run.stalled.is_(True), Run.status.in_(RUN_ACTIVE))) or 0
    yield GaugeMetricFamily("rlctl_runs_stalled", "Active runs with no training progress lately.", value=stalled)

    processes = GaugeMetricFamily(
        "rlctl_run_processes", "Supervised run processes by role and state (all replicas).", labels=["role", "status"]
    )
    rows = session.execute(
        select(RunProcess.role, RunProcess.status, func.count()).group_by(RunProcess.role, RunProcess.status)
    ).all()
    by_key = {(role, status): count for role, status, count in rows}
    for role, status in sorted(by_key.keys() | {(r, s) for r in PROCESS_ROLES for s in PROCESS_STATES}):
        processes.add_metric([role, status], by_key.get((role, status), 0))
    yield processes

    jobs = GaugeMetricFamily(
        "rlctl_jobs", "Background jobs by kind and state (all replicas).", labels=["kind", "status"]
    )
    rows = session.execute(select(Job.kind, Job.status, func.count()).group_by(Job.kind, Job.status)).all()
    job_counts = {(kind, status): count for kind, status, count in rows}
    for kind in sorted({kind for kind, _ in job_counts}):
        for status in sorted(set(JobStatus) | {s for k, s in job_counts if k == kind}):
            jobs.add_metric([kind, status], job_counts.get((kind, status), 0))
    yield jobs

    allowed, limited = session.execute(
        select(
            func.coalesce(func.sum(StatusCheck.checks_allowed), 0),
            func.coalesce(func.sum(StatusCheck.checks_limited), 0),
        )
    ).one()
    checks = CounterMetricFamily(
        "rlctl_status_checks", "Live status checks of runs, allowed or rate limited (all replicas).", labels=["outcome"]
    )
    checks.add_metric(["allowed"], allowed)
    checks.add_metric(["limited"], limited)
    yield checks
