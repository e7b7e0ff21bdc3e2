"""`/healthz` (the process answers) and `/readyz` (database reachable, schema current)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from rlctl.service.context import AppContext
from rlctl.service.db import migrate
from rlctl.service.deps import Ctx
from rlctl.service.errors import Unavailable
from rlctl.service.schemas import error_responses

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    database: str
    schema_revision: str | None
    head_revision: str | None


@router.get("/healthz", response_model=Health, summary="Liveness")
def healthz() -> Health:
    """Answers while the process serves requests."""
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, summary="Readiness", responses=error_responses(503))
async def readyz(ctx: Ctx) -> Readiness:
    """Ready when the database answers and its schema is at the newest migration."""
    return await run_in_threadpool(check_readiness, ctx)


def check_readiness(ctx: AppContext) -> Readiness:
    head = migrate.head_revision()
    try:
        with ctx.db.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        current = migrate.current_revision(ctx.db)
    except SQLAlchemyError as exc:
        raise Unavailable("database unreachable", {"reason": type(exc).__name__}) from exc
    if current != head:
        raise Unavailable(
            "database schema is behind: run `rlctl db upgrade`",
            {"schema_revision": current, "head_revision": head},
        )
    return Readiness(status="ready", database="ok", schema_revision=current, head_revision=head)
