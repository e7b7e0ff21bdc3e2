"""Run states and their transitions, each a compare-and-set in the database.

pending → [queued →] starting → running → stopping → stopped | completed | failed. Terminal states are sticky:
no transition leaves them, whoever asks and whenever, but one: a resume (`reopen`) makes a stopped or failed run
pending again, to continue from its checkpoint (docs/RUNS.md#resume-and-warm-start). A run waits `queued` while
admission cannot start it (rlctl/service/runs/admission.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from rlctl.service.db.models import Run
from rlctl.service.db.rows import changed_rows
from rlctl.service.db.types import utcnow
from rlctl.service.states import RUN_ACTIVE, RUN_TERMINAL, RunStatus

PENDING, STARTING, RUNNING, STOPPING = RunStatus.PENDING, RunStatus.STARTING, RunStatus.RUNNING, RunStatus.STOPPING
QUEUED = RunStatus.QUEUED
STOPPED, COMPLETED, FAILED = RunStatus.STOPPED, RunStatus.COMPLETED, RunStatus.FAILED
TERMINAL = RUN_TERMINAL
ACTIVE = RUN_ACTIVE
WAITING = frozenset({PENDING, QUEUED})  # accepted, nothing started: admission decides when
ADMITTED = frozenset({STARTING, RUNNING, STOPPING})  # holding the executor's resources

ALLOWED: dict[RunStatus, frozenset[RunStatus]] = {
    QUEUED: frozenset({PENDING}),
    STARTING: frozenset({PENDING, QUEUED}),
    RUNNING: frozenset({STARTING}),
    STOPPING: frozenset({PENDING, STARTING, RUNNING}),
    STOPPED: frozenset({PENDING, QUEUED, STARTING, RUNNING, STOPPING}),
    COMPLETED: frozenset({STARTING, RUNNING, STOPPING}),
    FAILED: frozenset({PENDING, QUEUED, STARTING, RUNNING, STOPPING}),
}


def transition(session: Session, run_id: str, to: RunStatus, **fields: Any) -> bool:
    """Move the run to `to` if its current state allows it; False (nothing changed) otherwise."""
    now = utcnow()
    values: dict[str, Any] = {"status": to, "updated_at": now, **fields}
    if to == RUNNING:
        values.setdefault("started_at", now)
    if to in TERMINAL:
        values.setdefault("ended_at", now)
    return changed_rows(session, update(Run).where(Run.id == run_id, Run.status.in_(ALLOWED[to])).values(**values)) == 1


def reopen(session: Session, run_id: str, allowed: frozenset[RunStatus], **fields: Any) -> bool:
    """Move a run in one of the `allowed` terminal states back to pending (a resume); False when it is not in one."""
    values: dict[str, Any] = {
        "status": PENDING,
        "updated_at": utcnow(),
        "ended_at": None,
        "failure": None,
        "stalled": False,
        **fields,
    }
    return changed_rows(session, update(Run).where(Run.id == run_id, Run.status.in_(allowed)).values(**values)) == 1


def running_seconds(run: Run, now: datetime) -> float:
    if run.started_at is None:
        return 0.0
    end = run.ended_at or now
    return max(0.0, (end - run.started_at).total_seconds())
