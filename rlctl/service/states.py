"""The states of runs, their processes and jobs: plain enums, importable without the database or the web stack.

`rlctl`'s client commands need them (choices, "is it over yet"), and each client call is a Python start-up:
importing them from the lifecycle modules would load SQLAlchemy and FastAPI for nothing (seconds per call).
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    PENDING = "pending"
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    COMPLETED = "completed"
    FAILED = "failed"


class ProcessStatus(StrEnum):
    """A supervised process as recorded (pending, running, exited) or as seen live (unknown: liveness unreadable)."""

    PENDING = "pending"
    RUNNING = "running"
    EXITED = "exited"
    UNKNOWN = "unknown"


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


RUN_TERMINAL = frozenset({RunStatus.STOPPED, RunStatus.COMPLETED, RunStatus.FAILED})
RUN_ACTIVE = frozenset(set(RunStatus) - RUN_TERMINAL)
JOB_TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
