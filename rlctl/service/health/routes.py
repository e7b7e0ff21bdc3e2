"""`/healthz` (the process answers) and `/readyz` (database reachable, schema current).

Both are async routes on the event loop, never in the thread pool: a probe must not wait for a worker thread
while blocking handlers hold every one of them (docs/ARCHITECTURE.md#performance). The server runs them ahead
of the requests queued on the loop (`rlctl.service.http.ProbesFirstProtocol`). `/readyz` answers from the
newest result of the database check, which `ReadinessMonitor` runs in the background (`readiness.py`).
"""

from __future__ import annotations

from functools import cache

import psycopg
from fastapi import APIRouter
from pydantic import BaseModel
from sqlalchemy import Select, String, column, select, table
from sqlalchemy.exc import SQLAlchemyError

from rlctl.service.db import migrate
from rlctl.service.db.engine import Database
from rlctl.service.db.plans import Read, ReadPlan
from rlctl.service.deps import Ctx
from rlctl.service.errors import Unavailable
from rlctl.service.health.readiness import Readiness, ReadinessMonitor
from rlctl.service.schemas import error_responses

router = APIRouter(tags=["health"])
# Alembic's table of the applied revision, read as a read plan so that PostgreSQL answers it on the loop.
_VERSION: Select[str] = select(column("version_num", String)).select_from(table("alembic_version"))


class Health(BaseModel):
    status: str


@router.get("/healthz", response_model=Health, summary="Liveness")
async def healthz() -> Health:
    """Answers while the process serves requests."""
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, summary="Readiness", responses=error_responses(503))
async def readyz(ctx: Ctx) -> Readiness:
    """Ready when the database answered and its schema was at the newest migration at the last check (at most
    half a second ago)."""
    return ReadinessMonitor.of(ctx).current()


def readiness_monitor(db: Database) -> ReadinessMonitor:
    """The background check of `db` behind /readyz."""
    return ReadinessMonitor(lambda: _check_database(db))


async def _check_database(db: Database) -> Readiness:
    head = _head_revision()
    try:
        current = await db.probe_read(_current_revision_plan)
    except (SQLAlchemyError, psycopg.Error) as exc:
        # No version table is a database never migrated: behind, like one with an older revision.
        if not _is_missing_table(exc):
            raise Unavailable("database unreachable", {"reason": type(exc).__name__}) from exc
        current = None
    if current != head:
        raise Unavailable(
            "database schema is behind: run `rlctl db upgrade`",
            {"schema_revision": current, "head_revision": head},
        )
    return Readiness(status="ready", database="ok", schema_revision=current, head_revision=head)


@cache
def _head_revision() -> str | None:
    # The migration scripts ship with the code: read once, not at every probe.
    return migrate.head_revision()


def _current_revision_plan() -> ReadPlan[str | None]:
    rows = yield Read(_VERSION)
    return rows[0][0] if rows else None


def _is_missing_table(exc: Exception) -> bool:
    cause = getattr(exc, "orig", None) or exc
    return isinstance(cause, psycopg.errors.UndefinedTable) or "no such table" in str(cause)
