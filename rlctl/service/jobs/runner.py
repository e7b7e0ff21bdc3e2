"""Runs long operations in the background and keeps their state in the database.

A job kind registers a handler. A handler receives a `JobHandle` to report progress and notice
cancellation, and returns the job's result. Jobs survive a service restart: a resumable kind starts
again (its handler picks up where the stored progress says), any other ends `failed` with the reason;
none is ever left `running`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from sqlalchemy import select, update

from rlctl.service.context import AppContext, Component
from rlctl.service.db.models import Job
from rlctl.service.db.rows import changed_rows
from rlctl.service.db.types import utcnow
from rlctl.service.states import JOB_TERMINAL, JobStatus

logger = logging.getLogger("rlctl.jobs")


TERMINAL = JOB_TERMINAL
UNFINISHED = (JobStatus.QUEUED, JobStatus.RUNNING)
PROGRESS_WRITE_INTERVAL_S = 0.5


class JobCancelled(Exception):
    """Raised by `JobHandle.check_cancelled` when a cancel was requested."""


class JobFailed(Exception):
    """A handler's way to end the job `failed` with a clear message (no stack trace is stored)."""


@dataclass(frozen=True)
class JobKind:
    name: str
    # (AppContext, handle) -> result: a model, or free-form JSON; stored as JSON with the job.
    handler: Callable[[Any, JobHandle], BaseModel | dict[str, Any]]
    resumable: bool = False


class JobHandle:
    def __init__(self, runner: JobRunner, job_id: str, params: dict[str, Any], resumed: bool) -> None:
        self.runner = runner
        self.job_id = job_id
        self.params = params
        self.resumed = resumed  # started again after a service restart
        self._last_write = 0.0
        self._cancel = threading.Event()

    def progress(self, done: int, total: int | None = None, force: bool = False) -> None:
        """Record progress (written at most every half second unless forced)."""
        now = time.monotonic()
        if not force and now - self._last_write < PROGRESS_WRITE_INTERVAL_S:
            return
        self._last_write = now
        values: dict[str, Any] = {"progress_done": done, "heartbeat_at": utcnow()}
        if total is not None:
            values["progress_total"] = total
        with self.runner.db.session() as session:
            session.execute(update(Job).where(Job.id == self.job_id).values(**values))
            requested = session.scalar(select(Job.cancel_requested).where(Job.id == self.job_id))
        if requested:
            self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def check_cancelled(self) -> None:
        if self._cancel.is_set():
            raise JobCancelled()

    def request_cancel(self) -> None:
        self._cancel.set()


class JobRunner(Component):
    def __init__(self, ctx: AppContext, workers: int = 2) -> None:
        self.ctx = ctx
        self.db = ctx.db
        self.replica_id = ctx.replica_id
        self._kinds: dict[str, JobKind] = {}
        self._handles: dict[str, JobHandle] = {}
        self._lock = threading.Lock()
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._closing = False

    def register(self, kind: JobKind) -> None:
        self._kinds[kind.name] = kind

    def open(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="job")
        self._recover()

    def close(self) -> None:
        """Ask running jobs to stop; the next start resumes or fails them (never left running)."""
        with self._lock:
            self._closing = True
            handles = list(self._handles.values())
        for handle in handles:
            handle.request_cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def submit(self, kind: str, params: dict[str, Any], total: int | None = None) -> str:
        if kind not in self._kinds:
            raise KeyError(f"unknown job kind {kind!r}")
        job_id = uuid.uuid4().hex[:16]
        with self.db.session() as session:
            session.add(
                Job(
                    id=job_id,
                    kind=kind,
                    status=JobStatus.QUEUED,
                    params=params,
                    progress_total=total,
                    owner_id=self.replica_id,
                    heartbeat_at=utcnow(),
                )
            )
        self._enqueue(job_id, resumed=False)
        return job_id

    def cancel(self, job_id: str) -> bool:
        """Cancel a queued job at once, or ask a running one to stop; False if it had already ended."""
        with self.db.session() as session:
            cancelled_queued = changed_rows(
                session,
                update(Job)
                .where(Job.id == job_id, Job.status == JobStatus.QUEUED)
                .values(status=JobStatus.CANCELLED, finished_at=utcnow(), cancel_requested=True),
            )
            requested = changed_rows(
                session,
                update(Job).where(Job.id == job_id, Job.status == JobStatus.RUNNING).values(cancel_requested=True),
            )
        with self._lock:
            handle = self._handles.get(job_id)
        if handle is not None:
            handle.request_cancel()
        return bool(cancelled_queued or requested)

    def wait(self, job_id: str, timeout: float) -> str:
        """Block until the job ends (tests, synchronous callers); returns its status."""
        deadline = time.monotonic() + timeout
        while True:
            with self.db.session() as session:
                status = session.scalar(select(Job.status).where(Job.id == job_id))
            if status in TERMINAL or time.monotonic() >= deadline:
                return status or ""
            time.sleep(0.1)

    def _enqueue(self, job_id: str, resumed: bool) -> None:
        assert self._pool is not None, "JobRunner.open() first"
        self._pool.submit(self._execute, job_id, resumed)

    def _execute(self, job_id: str, resumed: bool) -> None:
        with self.db.session() as session:
            started = changed_rows(
                session,
                update(Job)
                .where(Job.id == job_id, Job.status == JobStatus.QUEUED)
                .values(status=JobStatus.RUNNING, started_at=utcnow(), heartbeat_at=utcnow()),
            )
            job = session.get(Job, job_id)
            kind, params = (job.kind, dict(job.params)) if job else (None, {})
        if not started or kind is None:
            return  # cancelled while queued
        handle = JobHandle(self, job_id, params, resumed)
        with self._lock:
            self._handles[job_id] = handle
            if self._closing:  # claimed (`running`) before close() looked for running jobs: asked to stop as they are
                handle.request_cancel()
        try:
            result = self._kinds[kind].handler(self.ctx, handle)
        except JobCancelled:
            self._finish(job_id, JobStatus.CANCELLED, error="cancelled on request")
        except JobFailed as exc:
            self._finish(job_id, JobStatus.FAILED, error=self.ctx.scrub(str(exc)))
        except Exception as exc:  # noqa: BLE001 - a job's failure is its result, not the service's
            logger.exception("job %s (%s) failed", job_id, kind)
            self._finish(job_id, JobStatus.FAILED, error=self.ctx.scrub(f"{type(exc).__name__}: {exc}"))
        else:
            stored = result.model_dump(mode="json") if isinstance(result, BaseModel) else result
            self._finish(job_id, JobStatus.SUCCEEDED, result=stored)
        finally:
            with self._lock:
                self._handles.pop(job_id, None)

    def _interrupted_by_shutdown(self, job_id: str) -> bool:
        with self.db.session() as session:
            return not session.scalar(select(Job.cancel_requested).where(Job.id == job_id))

    def _finish(
        self, job_id: str, status: JobStatus, result: dict[str, Any] | None = None, error: str | None = None
    ) -> None:
        if status == JobStatus.CANCELLED and self._interrupted_by_shutdown(job_id):
            return  # stopped by the service closing, not by a user: recovery decides
        with self.db.session() as session:
            session.execute(
                update(Job)
                .where(Job.id == job_id, Job.status == JobStatus.RUNNING)
                .values(status=status, result=result, error=error, finished_at=utcnow())
            )

    def _recover(self) -> None:
        with self.db.session() as session:
            jobs = session.scalars(select(Job).where(Job.status.in_(UNFINISHED), Job.owner_id == self.replica_id)).all()
            pending = [(j.id, j.kind, j.status) for j in jobs]
        for job_id, kind, status in pending:
            job_kind = self._kinds.get(kind)
            if job_kind is not None and (status == JobStatus.QUEUED or job_kind.resumable):
                with self.db.session() as session:
                    session.execute(update(Job).where(Job.id == job_id).values(status=JobStatus.QUEUED))
                self._enqueue(job_id, resumed=status == JobStatus.RUNNING)
                continue
            reason = "the service restarted while this job ran; it cannot resume: submit it again"
            with self.db.session() as session:
                session.execute(
                    update(Job)
                    .where(Job.id == job_id, Job.status.in_(UNFINISHED))
                    .values(status=JobStatus.FAILED, error=reason, finished_at=utcnow())
                )
