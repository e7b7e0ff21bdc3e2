"""Job operations, shared by the REST routes and the agent tools."""

from __future__ import annotations

from sqlalchemy import select

from rlctl.service.context import AppContext
from rlctl.service.db.models import Job
from rlctl.service.db.rows import load_row
from rlctl.service.errors import InvalidState, NotFound
from rlctl.service.jobs.runner import TERMINAL, JobRunner
from rlctl.service.jobs.schemas import JobList, JobOut, JobProgress
from rlctl.service.pagination import DEFAULT_PAGE, newest_first_page
from rlctl.service.states import JobStatus


class JobNotFound(NotFound):
    code = "JOB_NOT_FOUND"
    subject, id_field = "job", "job_id"


def job_record(job: Job) -> JobOut:
    return JobOut(
        id=job.id,
        kind=job.kind,
        status=JobStatus(job.status),
        progress=JobProgress(done=job.progress_done, total=job.progress_total),
        params=job.params,
        result=job.result,
        error=job.error,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
    )


def get_job(ctx: AppContext, job_id: str) -> JobOut:
    with ctx.db.session() as session:
        return job_record(load_row(session, Job, job_id, JobNotFound))


def list_jobs(
    ctx: AppContext,
    kind: str | None = None,
    status: JobStatus | None = None,
    limit: int = DEFAULT_PAGE,
    cursor: str | None = None,
) -> JobList:
    query = select(Job)
    if kind:
        query = query.where(Job.kind == kind)
    if status:
        query = query.where(Job.status == status)
    with ctx.db.session() as session:
        records, next_cursor = newest_first_page(session, query, Job, limit, cursor, job_record)
    return JobList(jobs=records, count=len(records), next_cursor=next_cursor)


def cancel_job(ctx: AppContext, job_id: str) -> JobOut:
    with ctx.db.session() as session:
        job = load_row(session, Job, job_id, JobNotFound)
        if job.status in TERMINAL:
            raise InvalidState(f"job {job_id} is already {job.status}", {"job_id": job_id, "status": job.status})
    JobRunner.of(ctx).cancel(job_id)
    return get_job(ctx, job_id)
