"""HTTP models of collections (the batch runner)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from rlctl.sandbox.errors import DestinationError
from rlctl.sandbox.netgate import MAX_DESTINATIONS, parse_destination
from rlctl.service.jobs.schemas import JobOut
from rlctl.service.names import NAME_PATTERN
from rlctl.service.schemas import CheckpointRef


class CollectionStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"


class ItemStatus(StrEnum):
    """The outcome of one (prompt, run) pair."""

    KEPT = "kept"
    DISCARDED = "discarded"
    FAILED = "failed"


ENDED = frozenset({CollectionStatus.COMPLETED, CollectionStatus.CANCELLED, CollectionStatus.FAILED})

ToolName = Literal["terminal", "read_file", "write_file"]
DEFAULT_TOOLS: list[ToolName] = ["read_file", "write_file"]  # terminal only when a collection asks for it
BASE_URL_PATTERN = r"^https?://[A-Za-z0-9._~%-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%/-]*)?$"
NO_CONTROL = r"^[^\x00-\x1f\x7f]+$"


class PromptItem(BaseModel):
    """One line of a prompts JSONL: the prompt, an optional expected answer, and any other keys (kept as the
    trajectories' metadata, e.g. `task_id`)."""

    model_config = ConfigDict(extra="allow")

    prompt: str = Field(min_length=1, max_length=200_000)
    answer: str | int | float | None = Field(None, description="Expected answer, for scoring (`correctness`).")


class CheckpointModel(BaseModel):
    """A run's checkpoint as the collection's model, served by the service (docs/DATASETS.md)."""

    model_config = ConfigDict(extra="forbid")

    run: str = Field(pattern=NAME_PATTERN, description="The run (a local one) whose checkpoint answers.")
    step: int | None = Field(None, ge=0, description="The checkpoint's step; default: the run's newest.")


class CreateCollectionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="Name of the dataset the collection produces.")
    prompts: list[PromptItem] = Field(min_length=1, max_length=10_000, description="Duplicates are distinct items.")
    base_url: str | None = Field(
        None,
        max_length=2048,
        pattern=BASE_URL_PATTERN,
        description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8001/v1. The key comes from the server's "
        "settings (RLCTL_COLLECTION_API_KEY, or OPENROUTER_API_KEY for OpenRouter), never from the request. "
        "Needed with a model id; not given with a checkpoint, which the service serves itself.",
    )
    model: Annotated[str, Field(min_length=1, max_length=256, pattern=NO_CONTROL)] | CheckpointModel = Field(
        description="A model id the endpoint serves, or a run's checkpoint `{run, step}`.",
    )
    runs_per_prompt: int = Field(2, ge=2, le=64, description="Trajectories per prompt (GRPO needs a group).")
    concurrency: int = Field(4, ge=1, le=64, description="Trajectories run at once.")
    max_turns: int = Field(10, ge=1, le=100, description="Model calls per trajectory at most.")
    max_tokens: int = Field(1024, ge=1, le=131_072, description="Tokens per model answer at most.")
    temperature: float = Field(1.0, ge=0, le=2)
    system_prompt: str | None = Field(None, max_length=100_000)
    tools: list[ToolName] = Field(
        default_factory=lambda: list(DEFAULT_TOOLS),
        max_length=3,
        description="Built-in tools, in a per-trajectory work directory. `terminal` is off unless asked for; it "
        "runs in a sandbox (docs/SECURITY.md), and where none can be made the request is refused (409 "
        "SANDBOX_UNAVAILABLE).",
    )
    network: list[str] = Field(
        default_factory=list,
        max_length=MAX_DESTINATIONS,
        description="Destinations the sandboxed `terminal` may reach, as `host:port` (`[v6]:port` for IPv6); "
        "empty (the default): no network at all. Needs `terminal`. Reached through a proxy (`http_proxy`) and, "
        "for ports >= 1024, directly at host:port; names are resolved by the service, and an address that is not "
        "public is refused unless the server allows its range (docs/SECURITY.md#network). Bad entries: 422 with "
        "error type `network_destination_invalid`; names the server refuses: 422 NETWORK_DESTINATION_FORBIDDEN.",
    )
    tool_timeout_s: float = Field(30, ge=0.1, le=600, description="Time limit of one tool call.")
    tool_output_limit: int = Field(10_000, ge=100, le=1_000_000, description="Characters of tool output kept.")
    request_timeout_s: float = Field(120, ge=1, le=3600, description="Time limit of one model call.")
    discard_without_reasoning: bool = Field(
        True,
        description="Discard trajectories with no reasoning, as the batch runner this one follows does (recorded "
        "and counted as `discarded`, so a resume skips them); `false` keeps them.",
    )

    @field_validator("network")
    @classmethod
    def _destinations(cls, entries: list[str]) -> list[str]:
        """Each entry parsed and written one way (lower-case names, bracketed IPv6), duplicates dropped."""
        normal: list[str] = []
        for entry in entries:
            try:
                text = str(parse_destination(entry))
            except DestinationError as error:
                raise PydanticCustomError("network_destination_invalid", "{reason}", {"reason": str(error)}) from None
            if text not in normal:
                normal.append(text)
        return normal

    @model_validator(mode="after")
    def _endpoint_for_a_model_id(self) -> CreateCollectionRequest:
        if isinstance(self.model, str) and self.base_url is None:
            raise PydanticCustomError("base_url_missing", "`base_url` is needed with a model id")
        if isinstance(self.model, CheckpointModel) and self.base_url is not None:
            raise PydanticCustomError(
                "base_url_with_checkpoint", "a checkpoint is served by the service: leave `base_url` out"
            )
        return self

    @model_validator(mode="after")
    def _network_needs_terminal(self) -> CreateCollectionRequest:
        if self.network and "terminal" not in self.tools:
            raise PydanticCustomError(
                "network_without_terminal", "`network` is for the sandboxed `terminal` tool: add it to `tools`"
            )
        return self


class CollectionProgress(BaseModel):
    total: int
    kept: int
    discarded: int
    failed: int
    pending: int


class CollectionOut(BaseModel):
    id: str
    name: str
    status: CollectionStatus
    model: str = Field(description="The model id asked for; a checkpoint's is `{run_id}/step-{N}`.")
    base_url: str | None = Field(description="The endpoint; null for a checkpoint (served by the service).")
    checkpoint: CheckpointRef | None = Field(None, description="The run checkpoint that is the agent (lineage).")
    prompt_count: int
    runs_per_prompt: int
    params: dict[str, Any] = Field(description="The request without its prompts (and never a key).")
    progress: CollectionProgress
    job_id: str | None
    job: JobOut | None = Field(description="The job running (or last running) the collection.")
    dataset_id: str | None = Field(description="The dataset produced, once completed.")
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class CollectionList(BaseModel):
    collections: list[CollectionOut]
    count: int
    next_cursor: str | None


class CollectionItemOut(BaseModel):
    prompt_index: int
    run_index: int
    status: ItemStatus
    reason: str | None = Field(description="Why an item was discarded or failed.")
    api_calls: int
    tool_calls: int
    has_reasoning: bool
    completed: bool
    attempts: int
    finished_at: datetime


class CollectionItemsPage(BaseModel):
    collection_id: str
    offset: int
    limit: int
    total: int
    next_offset: int | None
    items: list[CollectionItemOut]
