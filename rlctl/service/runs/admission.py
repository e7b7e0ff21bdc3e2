"""Admission: which waiting runs start now, decided in the database (docs/RUNS.md#admission).

A run is accepted `pending`; an admission decision then moves it to `starting` or leaves it `queued`. Waiting
runs are taken highest `priority` first, first in first out within a priority (created_at, then id), and the
first one that does not fit blocks those behind it (no smaller run overtakes it: it would starve). Each replica
admits its own runs: their files live in its data directory and its executor holds their resources.

Every decision is one transaction that first updates the single `run_admission` row: on SQLite that takes the
database's write lock, on PostgreSQL the row's lock, so decisions run one at a time across threads, workers and
replicas, and each sees the states the one before it committed. Every state change is still a compare-and-set
(rlctl/service/runs/lifecycle.py): a run stopped while it waits is never admitted, and each freed slot admits once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rlctl.service.db.models import Run, RunAdmission
from rlctl.service.db.plans import Read, ReadPlan
from rlctl.service.db.rows import changed_rows
from rlctl.service.runs import lifecycle
from rlctl.supervisor.executor import NO_RESOURCES, Executor, Resources, Usage

QUEUE_ORDER = (Run.priority.desc(), Run.created_at.asc(), Run.id.asc())


def run_resources(run: Any) -> Resources:
    """A run's stored resources; none for a run recorded before they were (it asked for nothing)."""
    return Resources.from_dict(run.resources) if run.resources else NO_RESOURCES


def lock(session: Session) -> None:
    """Serialise admission decisions until this transaction ends. Migration 0007 writes the row; should it be
    missing (a database emptied by hand), the first decision writes it and only one such insert wins."""
    bump = update(RunAdmission).where(RunAdmission.id == 1).values(generation=RunAdmission.generation + 1)
    if changed_rows(session, bump) == 1:
        return
    try:
        with session.begin_nested():
            session.add(RunAdmission(id=1, generation=0))
    except IntegrityError:
        pass  # a concurrent decision wrote it: the update below waits for that one to end
    session.execute(bump)


def admit(session: Session, executor: Executor, owner_id: str) -> list[str]:
    """Move the waiting runs that fit now to `starting` (their ids, in admission order); queue the rest."""
    lock(session)
    held = session.execute(
        select(Run.status, Run.resources).where(Run.owner_id == owner_id, Run.status.in_(lifecycle.ADMITTED))
    ).all()
    usage = Usage(
        runs=len(held),
        resources=_total(held),
        starting=_total([row for row in held if row.status == lifecycle.STARTING]),
    )
    waiting = session.execute(
        select(Run.id, Run.status, Run.resources)
        .where(Run.owner_id == owner_id, Run.status.in_(lifecycle.WAITING))
        .order_by(*QUEUE_ORDER)
    ).all()
    admitted: list[str] = []
    blocked = False
    for run in waiting:
        resources = run_resources(run)
        if not blocked and executor.fits(resources, usage):
            if lifecycle.transition(session, run.id, lifecycle.STARTING, owner_id=owner_id):
                admitted.append(run.id)
                usage = Usage(usage.runs + 1, usage.resources + resources, usage.starting + resources)
            continue
        blocked = True
        if run.status == lifecycle.PENDING:
            lifecycle.transition(session, run.id, lifecycle.QUEUED)
    return admitted


def _total(rows: Sequence[Any]) -> Resources:
    total = NO_RESOURCES
    for row in rows:
        total = total + run_resources(row)
    return total


def queue_positions_plan(run_ids: Sequence[str]) -> ReadPlan[dict[str, int]]:
    """The 1-based place of each queued run among its replica's queued runs (runs not queued are left out). One
    query (none for no run): the queues of the replicas concerned, in order (a queue is short: it is what one host
    waits on)."""
    if not run_ids:
        return {}
    owners = select(Run.owner_id).where(Run.id.in_(run_ids), Run.status == lifecycle.QUEUED).distinct()
    queued = yield Read(
        select(Run.id, Run.owner_id)
        .where(Run.status == lifecycle.QUEUED, Run.owner_id.in_(owners))
        .order_by(*QUEUE_ORDER)
    )
    wanted = set(run_ids)
    places: dict[str | None, int] = {}  # per replica: queued runs counted so far
    positions: dict[str, int] = {}
    for row in queued:
        places[row.owner_id] = places.get(row.owner_id, 0) + 1
        if row.id in wanted:
            positions[row.id] = places[row.owner_id]
    return positions
