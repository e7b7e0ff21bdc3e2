"""HTTP models of runs."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.names import NAME_PATTERN
from service.runs.lifecycle import ProcessStatus, RunStatus
from service.schemas import ErrorBody
from service.settings import Backend

ProcessRole = Literal["api", "trainer", "env"]


class CreateRunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    environment: str = Field(pattern=NAME_PATTERN, description="Environment name, as listed by GET /environments.")
    config: dict[str, Any] = Field(default_factory=dict, description="Edits of configurable fields.")
    backend: Backend | None = Field(None, description="Training backend; the server's default when absent.")
    idempotency_key: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="Same key, same run: a retried request never starts a second run.",
    )


class Failure(BaseModel):
    kind: str = Field(description="process_exited, readiness_timeout, startup_error, drain_timeout, owner_lost")
    message: str
    process: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    log_tail: list[str] = Field(default_factory=list)


class ProcessOut(BaseModel):
    role: str
    pid: int | None
    status: ProcessStatus
    exit_code: int | None
    signal: int | None
    log_path: str | None
    started_at: datetime | None = None
    ended_at: datetime | None = None


class RunSummary(BaseModel):
    id: str
    environment: str
    backend: str
    status: RunStatus
    last_step: int | None
    total_steps: int | None
    stalled: bool
    wandb_run_name: str | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None


class RunWarning(BaseModel):
    code: str = Field(description="parameter_ignored: the training server has no field for a parameter rlctl sends")
    parameter: str | None
    message: str


class RunOut(RunSummary):
    created_by: str | None = Field(description="The name of the token that created the run (never the token).")
    environment_hash: str | None = Field(description="SHA-256 of the environment's source when the run was created.")
    config: dict[str, Any]
    config_path: str | None
    wandb_project: str | None
    wandb_url: str | None
    failure: Failure | None
    weights: str | None
    warnings: list[RunWarning] = Field(default_factory=list, description="What the trainer reported about its backend.")
    ports: dict[str, int]
    updated_at: datetime
    logs: dict[str, str]
    processes: list[ProcessOut]


class RunList(BaseModel):
    runs: list[RunSummary]
    count: int
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


class HeadlineMetrics(BaseModel):
    step: int | None
    reward_mean: float | None
    percent_correct: float | None
    eval_percent_correct: float | None
    loss: float | None


class LiveProcess(BaseModel):
    role: str
    pid: int | None
    status: ProcessStatus = Field(description="running, exited or unknown (pending before it was started)")
    exit_code: int | None
    signal: int | None
    log_path: str | None


class RunSnapshot(RunSummary):
    """What a live check saw; kept, and shown again to a check that comes too soon."""

    run_id: str
    checked_at: datetime
    processes: list[LiveProcess]
    running_time_seconds: float
    running_time_minutes: float
    metrics: HeadlineMetrics
    latest_metrics: dict[str, float]
    trainer: dict[str, Any]
    wandb_project: str | None
    wandb_url: str | None
    failure: Failure | None
    logs: dict[str, str]


class RunStatusOut(RunSnapshot):
    rate_limited: Literal[False]
    next_check_in_seconds: float


class RateLimitedBody(ErrorBody):
    rate_limited: Literal[True]
    run_id: str
    next_check_in_seconds: float
    last_checked_at: datetime
    last_snapshot: dict[str, Any] | None


class RunResults(RunSummary):
    run_id: str
    final_step: int | None
    final_metrics: dict[str, float]
    history: dict[str, list[list[float]]]
    checkpoints: list[dict[str, Any]]
    weights: str | None = Field(description="Local adapter directory or tinker:// URI of the trained weights.")
    wandb_project: str | None
    wandb_url: str | None
    failure: Failure | None


class RunMetrics(BaseModel):
    run_id: str
    metrics: dict[str, list[list[float]]] = Field(description='name → [[step, value], ...], e.g. "reward/mean".')
