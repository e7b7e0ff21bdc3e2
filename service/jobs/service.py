"""Job operations, shared by the REST routes and the agent tools."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from service.context import AppContext
from service.db.models import Job
from service.errors import InvalidState, NotFound, ValidationFailed
from service.jobs.runner import ALL_STATES, TERMINAL
from service.names import validate_name
from service.pagination import newest_first_page


class JobNotFound(NotFound):
    code = "JOB_NOT_FOUND"


def job_record(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "kind": job.kind,
        "status": job.status,
        "progress": {"done": job.progress_done, "total": job.progress_total},
        "params": job.params,
        "result": job.result,
        "error": job.error,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
    }


def get_job(ctx: AppContext, job_id: str) -> dict[str, Any]:
    with ctx.db.session() as session:
        return job_record(_load(session, job_id))


def list_jobs(
    ctx: AppContext, kind: str | None = None, status: str | None = None, limit: int = 50, cursor: str | None = None
) -> dict[str, Any]:
    if status is not None and status not in ALL_STATES:
        raise ValidationFailed(f"unknown status {status!r}", {"field": "status", "available": list(ALL_STATES)})
    query = select(Job)
    if kind:
        query = query.where(Job.kind == kind)
    if status:
        query = query.where(Job.status == status)
    with ctx.db.session() as session:
        records, next_cursor = newest_first_page(session, query, Job, limit, cursor, job_record)
    return {"jobs": records, "count": len(records), "next_cursor": next_cursor}


def cancel_job(ctx: AppContext, job_id: str) -> dict[str, Any]:
    with ctx.db.session() as session:
        job = _load(session, job_id)
        if job.status in TERMINAL:
            raise InvalidState(f"job {job_id} is already {job.status}", {"job_id": job_id, "status": job.status})
    ctx.jobs.cancel(job_id)
    return get_job(ctx, job_id)


def _load(session: Any, job_id: str) -> Job:
    validate_name(job_id, "job id")
    job = session.get(Job, job_id)
    if job is None:
        raise JobNotFound(f"no job with id {job_id!r}", {"job_id": job_id})
    return job
