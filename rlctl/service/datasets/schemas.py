"""HTTP models of trajectory datasets."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlctl.service.names import NAME_PATTERN
from rlctl.service.rewards.schemas import JudgeChoice, RewardSpec
from rlctl.service.schemas import CheckpointRef, ServerPath

UploadFormat = Literal[
    "auto",
    "openai",
    "sharegpt",
    "responses",
    "swe_agent",
    "tau_bench",
    "llamafactory",
    "openhands",
    "rlctl",
    "batch_runner",
]
OnError = Literal["fail", "skip"]
ContainerName = Literal["auto", "jsonl", "json"]
Operation = Literal["upload", "filter", "compress", "score", "collect"]
ExportFormat = Literal["rlctl", "sharegpt"]
SummarizerChoice = Literal["auto", "extractive", "model"]
FIELD_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
ToolName = Annotated[str, Field(min_length=1, max_length=200)]

_NAME_FIELD = Field(None, pattern=NAME_PATTERN, description="Name of the derived dataset; default: parent-operation.")
_TOKENIZER_FIELD = Field(
    None,
    pattern=NAME_PATTERN,
    description="Token counter: `approx`, `tiny`, `run`, or a tokenizer directory's name (RLCTL_TOKENIZER_DIRS).",
)


class UploadOptions(BaseModel):
    """How an upload is read and stored (the query parameters of POST /datasets)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Dataset name (letters, digits, '_' and '-'; need not be unique).")
    format: UploadFormat = Field("auto", description="Input format; `auto` detects it per record.")
    on_error: OnError = Field(
        "fail", description="`fail`: any bad line stores nothing (all are reported); `skip`: keep the good lines."
    )
    container: ContainerName = Field("auto", description="JSON Lines, one JSON document, or `auto`.")
    tokenizer: str | None = _TOKENIZER_FIELD


class TrainedRun(BaseModel):
    id: str
    mode: str = Field(description="offline or online")
    status: str
    weights: ServerPath | None = Field(description="The run's newest trained weights, once it has any.")
    created_at: datetime


class DatasetOut(BaseModel):
    id: str
    name: str
    parent_id: str | None = Field(description="The dataset this one was derived from (lineage).")
    operation: Operation
    parameters: dict[str, Any] = Field(description="The operation's parameters, as given or defaulted.")
    source_format: str | None = Field(description="Format requested at upload (`auto` or a format name).")
    status: Literal["ready"]
    record_count: int
    byte_size: int
    report: dict[str, Any] = Field(description="What the operation did: skipped lines, dropped records, metrics.")
    created_at: datetime
    runs: list[TrainedRun] | None = Field(
        None, description="Runs that trained on this dataset, newest first (lineage); given by GET /datasets/{id}."
    )
    checkpoint: CheckpointRef | None = Field(
        None, description="The run checkpoint whose model collected this dataset (lineage); null otherwise."
    )

    @model_validator(mode="after")
    def _collected_by(self) -> DatasetOut:
        """A collection's dataset keeps the checkpoint of its agent in its parameters (the collection's)."""
        if self.checkpoint is None and isinstance(found := self.parameters.get("checkpoint"), dict):
            self.checkpoint = CheckpointRef.model_validate(found)
        return self


class DerivedDatasetResult(BaseModel):
    """The result of a filter, compress or score job: the dataset it made."""

    dataset_id: str
    name: str
    record_count: int
    report: dict[str, Any] = Field(description="What the operation did: dropped records, metrics.")


class DatasetList(BaseModel):
    datasets: list[DatasetOut]
    count: int
    next_cursor: str | None


class RecordsPage(BaseModel):
    dataset_id: str
    offset: int
    limit: int
    total: int
    next_offset: int | None
    records: list[dict[str, Any]] = Field(description="Stored records: `conversations`, `metadata`, ...")


class MetricsPage(BaseModel):
    dataset_id: str
    offset: int
    limit: int
    total: int
    next_offset: int | None
    metrics: list[dict[str, Any]] = Field(description="Per-record compression metrics, in record order.")


class DatasetStatsOut(BaseModel):
    dataset_id: str
    record_count: int
    stats: dict[str, Any] = Field(
        description="tool_stats (count, success, failure, rates per tool), tool_calls, reasoning_stats (with "
        "coverage), completion_rate, api_calls, tokens (distribution), turns, source_formats, rewards."
    )


class FilterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = _NAME_FIELD
    drop_without_reasoning: bool = Field(False, description="Drop records with no <think> in any gpt turn.")
    drop_incomplete: bool = Field(False, description="Drop records that did not complete.")
    drop_hallucinated_tools: bool = Field(False, description="Drop records calling tools outside the allowed list.")
    allowed_tools: list[ToolName] | None = Field(
        None, max_length=1000, description="Allowed tool names; default: each record's declared tools."
    )
    min_tokens: int | None = Field(None, ge=0, le=100_000_000)
    max_tokens: int | None = Field(None, ge=0, le=100_000_000)
    tokenizer: str | None = _TOKENIZER_FIELD


class CompressRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = _NAME_FIELD
    target_max_tokens: int = Field(15250, ge=1, le=10_000_000)
    summary_target_tokens: int = Field(750, ge=1, le=1_000_000)
    protect_first_system: bool = True
    protect_first_human: bool = True
    protect_first_gpt: bool = True
    protect_first_tool: bool = True
    protect_last_n_turns: int = Field(4, ge=0, le=10_000)
    summarizer: SummarizerChoice = Field(
        "auto", description="`model` (the configured endpoint), `extractive`, or `auto`: the model when configured."
    )
    tokenizer: str | None = _TOKENIZER_FIELD


class JudgeOptions(JudgeChoice):
    """How dataset scoring asks the judge model: its model and rubric, the grouping and the calibration."""

    group_by: str | None = Field(
        None, pattern=FIELD_PATTERN, description="Metadata field that names the prompt; default: the human turns."
    )
    calibrate_with: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        description="A requested reward to measure the judge against (default: correctness, else source_reward, "
        "when requested).",
    )


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = _NAME_FIELD
    rewards: list[RewardSpec] = Field(
        min_length=1,
        max_length=16,
        description='Each reward function once, e.g. [{"name": "correctness", "weight": 1.0}, '
        '{"name": "format", "weight": 1.0}].',
    )
    answer_field: str = Field("answer", pattern=FIELD_PATTERN, description="Metadata field of the expected answer.")
    judge: JudgeOptions | None = Field(None, description="The judge's model, rubric and grouping (judge, completion).")


class GrpoExportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    group_by: str | None = Field(
        None, pattern=FIELD_PATTERN, description="Metadata field that names the prompt; default: the human turns."
    )
    normalize_by_std: bool = Field(False, description="Divide advantages by the group's standard deviation.")
    min_group_size: int = Field(2, ge=2, le=4096)
    drop_zero_variance: bool = Field(False, description="Report groups whose rewards are all equal, not export them.")
