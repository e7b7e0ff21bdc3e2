"""HTTP models of jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel

from rlctl.service.schemas import ServerJson
from rlctl.service.states import JobStatus


class JobProgress(BaseModel):
    done: int
    total: int | None


class JobOut(BaseModel):
    id: str
    kind: str
    status: JobStatus
    progress: JobProgress
    params: dict[str, Any]
    result: ServerJson | None
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class JobList(BaseModel):
    jobs: list[JobOut]
    count: int
    next_cursor: str | None
