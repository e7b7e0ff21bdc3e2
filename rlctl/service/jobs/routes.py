"""HTTP routes of jobs: thin adapters over rlctl.service.jobs.service."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from rlctl.service.auth.guard import OPERATE, READ
from rlctl.service.deps import Ctx
from rlctl.service.jobs import service
from rlctl.service.jobs.schemas import JobList, JobOut
from rlctl.service.names import name_path
from rlctl.service.pagination import DEFAULT_PAGE, PageCursor, PageLimit
from rlctl.service.schemas import error_responses
from rlctl.service.states import JobStatus

router = APIRouter(prefix="/jobs", tags=["jobs"], responses=error_responses(401, 403))
JobId = Annotated[str, name_path("Job id, as returned by the operation that started it.")]


@router.get(
    "", response_model=JobList, summary="List background jobs", responses=error_responses(422), openapi_extra=READ
)
async def list_jobs(
    ctx: Ctx,
    kind: Annotated[str | None, Query(max_length=32, description="Only jobs of this kind.")] = None,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this state.")] = None,
    limit: PageLimit = DEFAULT_PAGE,
    cursor: PageCursor = None,
) -> JobList:
    """Newest first."""
    return await run_in_threadpool(service.list_jobs, ctx, kind, status, limit, cursor)


@router.get(
    "/{job_id}", response_model=JobOut, summary="Get a job", responses=error_responses(404, 422), openapi_extra=READ
)
async def get_job(ctx: Ctx, job_id: JobId) -> JobOut:
    """Status (queued, running, succeeded, failed, cancelled), progress {done, total}, result or error."""
    return await run_in_threadpool(service.get_job, ctx, job_id)


@router.post(
    "/{job_id}/cancel",
    response_model=JobOut,
    summary="Cancel a job",
    responses=error_responses(404, 409, 422),
    openapi_extra=OPERATE,
)
async def cancel_job(ctx: Ctx, job_id: JobId) -> JobOut:
    """A queued job ends at once; a running one stops at its next checkpoint. An ended job is a 409."""
    return await run_in_threadpool(service.cancel_job, ctx, job_id)
