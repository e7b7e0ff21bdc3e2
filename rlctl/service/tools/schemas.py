"""The agent tools' own arguments and results: what differs from the REST contracts (the tool session supplies the
environment and config; results keep the reference's field names, such as `run_id`). Every limit comes from the
domains' models; operations that are the same as a REST one take its request model (rlctl/service/tools/*_tools.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from rlctl.service.collections.schemas import CollectionProgress, CollectionStatus
from rlctl.service.datasets.schemas import (
    CompressRequest,
    GrpoExportRequest,
    OnError,
    Operation,
    ScoreRequest,
    UploadFormat,
)
from rlctl.service.environments.schemas import CatalogError
from rlctl.service.inference_tests.schemas import (
    BASE_URL_DESCRIPTION,
    DEFAULT_GROUP_SIZE,
    DEFAULT_MODELS,
    DEFAULT_NUM_STEPS,
    BaseUrl,
    GroupSize,
    InferenceTestSummary,
    ModelIds,
    ModelResult,
    NumSteps,
)
from rlctl.service.jobs.schemas import JobProgress
from rlctl.service.pagination import CURSOR_PATTERN, DEFAULT_PAGE, MAX_PAGE
from rlctl.service.runs.schemas import (
    DatasetSource,
    Failure,
    HeadlineMetrics,
    InitFrom,
    LiveProcess,
    RunResources,
)
from rlctl.service.schemas import ServerJson, ServerJsonList, ServerPath, ServerPaths, ServerValue
from rlctl.service.settings import Backend
from rlctl.service.states import JobStatus, RunStatus
from rlctl.service.tools.registry import ToolArguments

RUN_ID = "The run id returned by rl_start_training or rl_list_runs."
DATASET_ID = "A dataset id from rl_upload_dataset or rl_list_datasets."
ConfigValue = str | int | float | bool | None


def _unless_none() -> Any:
    """An optional result field left out when empty: an `error` field present means the call failed."""
    return Field(None, exclude_if=lambda value: value is None)


# --- arguments ---


class SelectEnvironmentArgs(ToolArguments):
    name: str = Field(description="Environment name, e.g. gsm8k.")


class EditConfigArgs(ToolArguments):
    field: str = Field(description="A configurable field name from rl_get_current_config.")
    value: ConfigValue = Field(description="The new value, of the field's type.")


class MixedEnvironment(ToolArguments):
    """One environment of a mixed run started by a tool: its name and weight, with the session's pending edits
    (EnvironmentShare of POST /runs, less its own config: strict function-calling schemas take no free mapping)."""

    name: str = Field(description="Environment name, e.g. echo.")
    weight: float = Field(1.0, gt=0, le=1000, description="Its share of the rollouts, relative to the others'.")


class StartTrainingArgs(ToolArguments):
    backend: Backend | None = Field(
        None, description="tinker (the Tinker service) or local (this machine); null: the server default."
    )
    resources: RunResources | None = Field(
        None, description="cpus, gpus, memory_gb the run asks for; null: the backend's defaults."
    )
    priority: int = Field(
        0, ge=-1000, le=1000, description="When the run must wait (queued): a higher priority starts first."
    )
    dataset: DatasetSource | None = Field(
        None,
        description="Train on this trajectory dataset instead of the selected environment; its config edits are "
        "the pending ones when dataset_offline (or dataset_online) is the selected environment. Null: the "
        "selected environment.",
    )
    init_from: InitFrom | None = Field(
        None, description="A warm start: {run, step} of another run's checkpoint whose weights start this run."
    )
    environments: list[MixedEnvironment] | None = Field(
        None,
        max_length=8,
        description="Several environments mixed in one run by weight, instead of the selected one; each takes the "
        "pending config edits. Null: the selected environment.",
    )


class EvaluationArgs(ToolArguments):
    evaluation_id: str = Field(description="The id rl_evaluate returned.")


class RunArgs(ToolArguments):
    run_id: str = Field(description=RUN_ID)


class ResumeTrainingArgs(RunArgs):
    step: int | None = Field(
        None, ge=0, le=(1 << 62), description="The checkpoint's step to continue from; null: the newest."
    )


class ListRunsArgs(ToolArguments):
    status: RunStatus | None = Field(None, description="Only runs in this state; null for all.")
    environment: str | None = Field(None, description="Only runs of this environment; null for all.")
    limit: int = Field(DEFAULT_PAGE, ge=1, le=MAX_PAGE, description="Runs per page; null for 50.")
    cursor: str | None = Field(
        None, pattern=CURSOR_PATTERN, description="next_cursor of the page before; null for the first page."
    )


class TestInferenceArgs(ToolArguments):
    num_steps: NumSteps = DEFAULT_NUM_STEPS
    group_size: GroupSize = DEFAULT_GROUP_SIZE
    models: ModelIds = Field(default_factory=lambda: list(DEFAULT_MODELS))
    base_url: BaseUrl | None = Field(None, description=BASE_URL_DESCRIPTION)


class InferenceTestArgs(ToolArguments):
    test_id: str = Field(description="The test_id returned by rl_test_inference.")


class UploadDatasetArgs(ToolArguments):
    name: str = Field(description="Dataset name (letters, digits, '_' and '-').")
    content: str = Field(description="The JSONL text.")
    format: UploadFormat = Field("auto", description="Input format; `auto` detects it per record.")
    on_error: OnError = Field("fail", description="`fail`: any bad line stores nothing; `skip`: keep the good lines.")


class DatasetArgs(ToolArguments):
    dataset_id: str = Field(description=DATASET_ID)


class CompressDatasetArgs(CompressRequest, DatasetArgs):
    pass


class ScoreDatasetArgs(ScoreRequest, DatasetArgs):
    pass


class ExportGrpoArgs(GrpoExportRequest, DatasetArgs):
    pass


class JobArgs(ToolArguments):
    job_id: str = Field(description="The job_id a tool returned.")


# --- results ---


class EnvironmentBrief(BaseModel):
    name: str
    description: str
    class_name: str
    file_path: ServerPath
    trainable_by_name: bool = Field(
        description="False for dataset_offline / dataset_online: train those with rl_start_training's `dataset`."
    )


class EnvironmentsResult(BaseModel):
    environments: list[EnvironmentBrief]
    count: int
    tips: list[str]
    errors: list[CatalogError] | None = _unless_none()


class SelectedResult(BaseModel):
    message: str
    environment: str
    file_path: ServerPath
    description: str


class CurrentField(BaseModel):
    name: str
    type: str
    default: Any = None
    description: str
    current_value: Any = None


class LockedField(BaseModel):
    name: str
    type: str
    description: str
    locked_value: ServerValue = None


class CurrentConfigResult(BaseModel):
    environment: str
    backend: Backend
    configurable_fields: list[CurrentField]
    locked_fields: list[LockedField]
    tip: str


class EditedResult(BaseModel):
    message: str
    field: str
    value: ConfigValue
    config: ServerJson


class StartedResult(BaseModel):
    run_id: str
    status: RunStatus
    environment: str
    dataset_id: str | None = None
    backend: Backend
    config: ServerJson
    wandb_project: str | None
    wandb_run_name: str | None
    config_path: ServerPath | None
    logs: ServerPaths
    message: str


class StatusResult(BaseModel):
    run_id: str
    status: RunStatus
    environment: str
    processes: list[LiveProcess]
    running_time_minutes: float
    metrics: HeadlineMetrics
    stalled: bool
    failure: Failure | None
    wandb_project: str | None
    wandb_run_name: str | None
    wandb_url: str | None
    logs: ServerPaths
    live: bool = Field(description="False for an ended run: its final state, outside the rate limit.")
    next_check_in_seconds: float
    rate_limited: Literal[False] = Field(description="Always false here: the check was answered.")


class RateLimitedResult(BaseModel):
    rate_limited: Literal[True]
    run_id: str
    message: str
    next_check_in_seconds: float
    last_snapshot: dict[str, Any] | None
    stored: dict[str, Any] | None = Field(description="The run's stored record now: status, step, failure.")


class StoppedResult(BaseModel):
    run_id: str
    status: RunStatus
    message: str


class ResultsResult(BaseModel):
    run_id: str
    status: RunStatus
    environment: str
    final_step: int | None
    total_steps: int | None
    final_metrics: dict[str, float]
    history: dict[str, list[list[float]]] = Field(description="Main metrics, [[step, value], ...], downsampled.")
    weights: ServerPath | None
    best_checkpoint: ServerJson | None = Field(description="The checkpoint with the best mean best_metric.")
    collapse: dict[str, Any] | None = Field(description="Set when the run collapsed: the step where it began.")
    checkpoints: ServerJsonList = Field(description="The last few checkpoints.")
    wandb_project: str | None
    wandb_run_name: str | None
    wandb_url: str | None
    failure: Failure | None


class RunBrief(BaseModel):
    run_id: str
    environment: str
    backend: str
    status: RunStatus
    queue_position: int | None = Field(None, description="While queued: its place in the queue (1 starts next).")
    step: int | None
    total_steps: int | None
    created_at: datetime


class RunsResult(BaseModel):
    runs: list[RunBrief]
    count: int
    has_more: bool = Field(description="True when more runs follow: call again with cursor = next_cursor.")
    next_cursor: str | None = Field(description="Pass as cursor for the next page; null on the last page.")


class InferenceStartedResult(BaseModel):
    test_id: str
    status: JobStatus
    environment: str
    models: list[str]
    num_steps: int
    group_size: int
    base_url: str
    message: str


class InferenceTestReport(BaseModel):
    test_id: str
    status: JobStatus
    environment: str
    progress: JobProgress
    models_tested: list[ModelResult] | None
    summary: InferenceTestSummary | None
    error: str | None = _unless_none()


class UploadedResult(BaseModel):
    dataset_id: str
    name: str
    record_count: int
    report: dict[str, Any]
    message: str


class DatasetBrief(BaseModel):
    id: str
    name: str
    parent_id: str | None
    operation: Operation
    record_count: int
    created_at: datetime


class DatasetsResult(BaseModel):
    datasets: list[DatasetBrief]
    count: int


class JobStartedResult(BaseModel):
    job_id: str
    status: JobStatus
    message: str


class CollectionStartedResult(BaseModel):
    collection_id: str
    status: CollectionStatus
    progress: CollectionProgress
    message: str
    job_id: str | None


class JobResult(BaseModel):
    id: str
    kind: str
    status: JobStatus
    progress: JobProgress
    result: dict[str, Any] | None
    error: str | None = _unless_none()
