"""HTTP models of runs."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlctl.service.names import NAME_PATTERN
from rlctl.service.pagination import CURSOR_PATTERN, DEFAULT_PAGE, MAX_PAGE
from rlctl.service.rewards.schemas import JudgeChoice, RewardSpec
from rlctl.service.schemas import ErrorBody, ServerJson, ServerJsonList, ServerPath, ServerPaths, ServerText
from rlctl.service.settings import Backend
from rlctl.service.states import ProcessStatus, RunStatus

ProcessRole = Literal["api", "trainer", "env"]
PromptSplit = Literal["train", "held_out"]


class DatasetMode(StrEnum):
    OFFLINE = "offline"
    ONLINE = "online"
    SFT = "sft"


class DatasetSource(BaseModel):
    """A trajectory dataset to train on instead of an environment (docs/RUNS.md#training-on-a-dataset)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=NAME_PATTERN, description="Dataset id, as listed by GET /datasets.")
    mode: DatasetMode = Field(
        DatasetMode.OFFLINE,
        description="offline: train on the stored completions (the dataset must be scored); "
        "online: its prompts, answered by the policy and scored by `rewards`; "
        "sft: supervised, cross-entropy on the top_n best-scored stored completions of each group.",
    )
    top_n: int | None = Field(
        None, ge=1, le=1024, description="sft: the completions of each group trained, best score first; default 1."
    )
    held_out: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Share of prompts kept out of training, for evaluation (GET /runs/{id}/prompts).",
    )
    group_by: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$",
        description="Metadata field that names the prompt; default: the human turns before the first assistant turn.",
    )
    rewards: list[RewardSpec] = Field(
        default_factory=list,
        max_length=16,
        description='online: the rewards of the policy\'s completions, e.g. [{"name": "correctness", "weight": 1}]; '
        "judge and completion score each prompt's group with the judge model.",
    )
    answer_field: str = Field(
        "answer", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$", description="Metadata field of the expected answer."
    )
    judge: JudgeChoice | None = Field(
        None, description="online, with the judge or completion reward: the judge's model and rubric."
    )

    @model_validator(mode="after")
    def top_n_of_sft(self) -> Self:
        if self.top_n is not None and self.mode != DatasetMode.SFT:
            raise ValueError("top_n is the number of completions an sft run trains per group: give mode sft")
        return self


class RunResources(BaseModel):
    """What a run asks for (docs/RUNS.md#resources); each value left out takes its backend's default. The one
    model of POST /runs, rl_start_training and `rlctl runs start`."""

    model_config = ConfigDict(extra="forbid")

    cpus: float | None = Field(None, gt=0, le=1024, description="CPU cores; default 1.")
    gpus: int | None = Field(
        None, ge=0, le=64, description="Whole GPUs; default 1 for a local-backend run where there is a GPU, else 0."
    )
    memory_gb: float | None = Field(None, gt=0, le=65536, description="Memory in GB; default 1.")


class ResourcesOut(BaseModel):
    cpus: float
    gpus: int
    memory_gb: float


class InitFrom(BaseModel):
    """Another run's checkpoint whose weights start a new run (a warm start; docs/RUNS.md#resume-and-warm-start)."""

    model_config = ConfigDict(extra="forbid")

    run: str = Field(pattern=NAME_PATTERN, description="The source run's id.")
    step: int | None = Field(None, ge=0, le=(1 << 62), description="Its checkpoint's step; null: its newest.")


class ResumeRunRequest(BaseModel):
    """POST /runs/{id}/resume and rl_resume_training: which checkpoint a stopped or failed run continues from."""

    model_config = ConfigDict(extra="forbid")

    step: int | None = Field(
        None, ge=0, le=(1 << 62), description="The checkpoint's step; null: the newest. Later ones are dropped."
    )


MAX_MIXED_ENVIRONMENTS = 8  # one process each, all sharing the run's inference server


class EnvironmentShare(BaseModel):
    """One environment of a mixed run (docs/RUNS.md#mixed-environments)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="Environment name, as listed by GET /environments.")
    weight: float = Field(1.0, gt=0, le=1000, description="Its share of the rollouts, relative to the others' weights.")
    config: dict[str, Any] = Field(
        default_factory=dict, description="Edits of this environment's fields, over the run's `config`."
    )


class CheckpointPins(BaseModel):
    run_id: str
    pinned: list[int] = Field(description="The steps whose checkpoints retention never deletes.")


class CreateRunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    environment: str | None = Field(
        None, pattern=NAME_PATTERN, description="Environment name, as listed by GET /environments."
    )
    environments: list[EnvironmentShare] | None = Field(
        None,
        min_length=1,
        max_length=MAX_MIXED_ENVIRONMENTS,
        description="Several environments mixed in one run by weight, instead of `environment`.",
    )
    dataset: DatasetSource | None = Field(
        None, description="A trajectory dataset to train on, instead of an environment."
    )
    config: dict[str, Any] = Field(default_factory=dict, description="Edits of configurable fields.")
    backend: Backend | None = Field(None, description="Training backend; the server's default when absent.")
    resources: RunResources | None = Field(None, description="CPUs, GPUs and memory; the backend's defaults.")
    priority: int = Field(
        0, ge=-1000, le=1000, description="Queue order: a higher priority starts first; first come first within one."
    )
    idempotency_key: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="Same key, same run: a retried request never starts a second run.",
    )
    init_from: InitFrom | None = Field(
        None, description="Start from another run's checkpoint (its weights, not its optimiser state): a warm start."
    )

    @model_validator(mode="after")
    def one_source(self) -> Self:
        if sum(source is not None for source in (self.environment, self.environments, self.dataset)) != 1:
            raise ValueError("give either environment, environments or dataset (exactly one)")
        return self


class Failure(BaseModel):
    kind: str = Field(description="process_exited, readiness_timeout, startup_error, drain_timeout, owner_lost")
    message: ServerText
    process: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    log_tail: list[ServerText] = Field(default_factory=list)


class ProcessOut(BaseModel):
    role: str
    pid: int | None
    status: ProcessStatus
    exit_code: int | None
    signal: int | None
    log_path: ServerPath | None
    started_at: datetime | None = None
    ended_at: datetime | None = None


class RunSummary(BaseModel):
    id: str
    environment: str
    dataset_id: str | None = Field(None, description="The dataset the run trains on (lineage), if any.")
    dataset_mode: DatasetMode | None = None
    backend: str
    status: RunStatus
    priority: int = 0
    queue_position: int | None = Field(
        None, description="While `queued`: its place in the queue (1 starts next); null otherwise."
    )
    last_step: int | None
    total_steps: int | None
    stalled: bool
    wandb_run_name: str | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None


class RunWarning(BaseModel):
    code: str = Field(
        description="parameter_ignored (the training server has no field for a parameter rlctl sends), "
        "wandb_unreachable, wandb_key_rejected, wandb_offline (W&B logs offline; see `wandb`), wandb_log_failed"
    )
    parameter: str | None
    message: ServerText


class Collapse(BaseModel):
    step: int = Field(description="The step where the collapse began.")
    detected_at: int
    reason: Literal["reward_drop", "empty_completions"]
    metric: str
    best: float | None
    value: float | None


class WandbState(BaseModel):
    mode: Literal["online", "offline", "disabled"]
    reason: str | None = Field(None, description="Why the run logs offline, when W&B failed the check.")
    offline_dir: ServerPath | None = Field(None, description="Where the offline W&B files are.")
    sync_command: ServerText | None = Field(None, description="How to upload them to W&B later.")


class RunOut(RunSummary):
    created_by: str | None = Field(description="The name of the token that created the run (never the token).")
    environment_hash: str | None = Field(description="SHA-256 of the environment's source when the run was created.")
    config: ServerJson
    config_path: ServerPath | None
    wandb_project: str | None
    wandb_url: str | None
    wandb: WandbState | None = Field(None, description="How the run reaches W&B.")
    failure: Failure | None
    weights: ServerPath | None
    environments: list[dict[str, Any]] | None = Field(
        None, description="A mixed run's environments: name, weight and metric prefix of each."
    )
    warnings: list[RunWarning] = Field(default_factory=list, description="What the trainer reported about its backend.")
    collapse: Collapse | None = Field(None, description="Set when the run collapsed, with the step where it began.")
    dataset: dict[str, Any] | None = Field(
        None, description="A dataset run's split: counts of groups or prompts, what was left out and why."
    )
    ports: dict[str, int]
    init_from: dict[str, Any] | None = Field(
        None, description="The checkpoint a warm-started run began from: {run, step} (its lineage); null otherwise."
    )
    resources: ResourcesOut | None = Field(None, description="What the run asked for (null: recorded before).")
    executor: str = Field("local", description="Where its processes run: local or ray (docs/RUNS.md#executors).")
    executor_handle: str | None = Field(None, description="The executor's id of the run (a Ray submission id).")
    updated_at: datetime
    logs: ServerPaths
    processes: list[ProcessOut]


class RunListQuery(BaseModel):
    """GET /runs' query (read by the route itself: rlctl/service/pagination.py, QueryModel)."""

    status: RunStatus | None = Field(None, description="Only runs in this state.")
    environment: str | None = Field(None, max_length=128, description="Only runs of this environment.")
    limit: int = Field(DEFAULT_PAGE, ge=1, le=MAX_PAGE)
    cursor: str | None = Field(None, pattern=CURSOR_PATTERN, description="`next_cursor` of the page before.")
    dataset_id: str | None = Field(None, max_length=128, description="Only runs trained on this dataset.")


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
    log_path: ServerPath | None


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
    logs: ServerPaths


class RunStatusOut(RunSnapshot):
    live: bool = Field(
        description="False for a run that has ended (its final, stored state, outside the limit) and for a "
        "read-only token's check (the last live check's snapshot)."
    )
    rate_limited: Literal[False]
    next_check_in_seconds: float = Field(0.0, description="0 for an ended run: its state no longer changes.")


class RateLimitedBody(ErrorBody):
    rate_limited: Literal[True]
    run_id: str
    next_check_in_seconds: float
    last_checked_at: datetime
    last_snapshot: dict[str, Any] | None
    stored: dict[str, Any] = Field(description="The run's stored record now (status, step, failure), never limited.")


class RunResults(RunSummary):
    run_id: str
    final_step: int | None
    final_metrics: dict[str, float]
    history: dict[str, list[list[float]]]
    checkpoints: ServerJsonList
    weights: ServerPath | None = Field(description="Local adapter directory or tinker:// URI of the final weights.")
    best_checkpoint: ServerJson | None = Field(
        description="The checkpoint with the best mean of the run's best_metric: {step, path, weights, value}."
    )
    collapse: Collapse | None = Field(description="Set when the run collapsed, with the step where it began.")
    wandb_project: str | None
    wandb_url: str | None
    failure: Failure | None


class RunMetrics(BaseModel):
    run_id: str
    metrics: dict[str, list[list[float]]] = Field(description='name → [[step, value], ...], e.g. "reward/mean".')


class RunPrompt(BaseModel):
    group_key: str = Field(description="SHA-256 of the prompt: the key records are grouped by.")
    messages: list[dict[str, Any]] = Field(description="The turns before the first assistant turn.")
    metadata: dict[str, Any]
    records: int | None = Field(None, description="offline: stored completions of this prompt.")


class RunPrompts(BaseModel):
    run_id: str
    split: PromptSplit
    prompts: list[RunPrompt]
    total: int
    offset: int


# --- a run's node on Ray (docs/RAY.md): the internal channel, authenticated by the run's secret ---


class NodeProcess(BaseModel):
    """One process as the node starts it; paths carry the placeholders each node replaces with its own."""

    role: ProcessRole
    argv: list[str]
    env: dict[str, str]  # only what differs from the node's own environment
    cwd: str
    log_path: str
    ready: dict[str, str]  # {"kind": "http" | "atropos", "url": ..., "envs": "N" (a mixed run's environments)}
    ready_timeout_s: float
    after: list[ProcessRole] | None = None  # roles ready before it is spawned; None: the one before it
    probe_after: list[ProcessRole] = []  # roles ready before its readiness is probed


class NodeSupervision(BaseModel):
    stop_grace_s: float
    poll_interval_s: float
    stall_after_s: float | None
    drain_timeout_s: float
    report_interval_s: float
    fork_server: bool = False  # the run's processes are forked from a fork server of its own (RLCTL_FORK_SERVER)


class NodePlan(BaseModel):
    """What a run's node-side supervisor needs: fetched once, with the bootstrap secret, which it spends."""

    run_id: str
    secret: str  # the run secret for every later call (the control plane keeps only its hash)
    files: dict[str, str]  # path under the node's data directory -> text
    processes: list[NodeProcess]
    prepare: list[str]  # a command run before the first process (the local backend's tiny model); empty: none
    logs: dict[str, str]
    supervision: NodeSupervision
    gpus: int = 0  # the GPUs the run asked for: Ray assigned them to the job (CUDA_VISIBLE_DEVICES), or none


class NodeEvent(BaseModel):
    """A supervisor event on the node: process_started, running, process_exited, stall, finished."""

    model_config = ConfigDict(extra="allow")
    type: Literal["process_started", "running", "process_exited", "stall", "finished"]


class NodeChunk(BaseModel):
    offset: int = Field(ge=0)
    data: str = Field(max_length=1 << 20)  # base64


class NodeReport(BaseModel):
    events: list[NodeEvent] = Field(default_factory=list, max_length=1000)
    files: dict[Literal["log/api", "log/trainer", "log/env", "metrics", "env_metrics"], NodeChunk] = Field(
        default_factory=dict
    )
    trainer_state: dict[str, Any] | None = None


class NodeReportAnswer(BaseModel):
    offsets: dict[str, int]  # how much of each mirrored file the control plane holds: the next chunk starts there
    stop: bool  # the run is stopping (or over): the node stops its processes
