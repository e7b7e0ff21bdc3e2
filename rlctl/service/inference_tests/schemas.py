"""HTTP models of inference tests."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from rlctl.service.jobs.schemas import JobProgress
from rlctl.service.names import NAME_PATTERN
from rlctl.service.schemas import ServerPath, ServerPaths
from rlctl.service.states import JobStatus

DEFAULT_MODELS = ("qwen/qwen3-8b", "z-ai/glm-4.7-flash", "minimax/minimax-m2.7")
DEFAULT_NUM_STEPS = 3
DEFAULT_GROUP_SIZE = 16
MAX_NUM_STEPS = 100
MAX_GROUP_SIZE = 128
MAX_MODELS = 8
# Model ids as providers spell them (`qwen/qwen3-8b`, `org/model:free`, a local path); no spaces, no backslash.
MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+/-]{0,199}$"
# The path is printable ASCII (anything else is percent-encoded in a URL). Not `\S`: Python's and JSON Schema's
# regexes disagree on what is whitespace (U+0085), and a client must be able to trust the published pattern.
BASE_URL_PATTERN = r"^https?://[A-Za-z0-9._~-]+(:[0-9]{1,5})?(/[!-~]*)?$"

ModelId = Annotated[str, Field(pattern=MODEL_PATTERN)]


def _distinct(models: list[str]) -> list[str]:
    if len(set(models)) != len(models):
        raise ValueError("models must not repeat a model id")
    return models


# The parameters an inference test shares with the agent tool rl_test_inference: each limit written here once.
NumSteps = Annotated[int, Field(ge=1, le=MAX_NUM_STEPS, description="Groups (steps) per model.")]
GroupSize = Annotated[int, Field(ge=1, le=MAX_GROUP_SIZE, description="Completions per group.")]
ModelIds = Annotated[
    list[ModelId],
    Field(
        min_length=1,
        max_length=MAX_MODELS,
        json_schema_extra={"uniqueItems": True},
        description="Model ids at the endpoint; each is tested on its own, concurrently.",
    ),
    AfterValidator(_distinct),
]
BaseUrl = Annotated[str, Field(max_length=2000, pattern=BASE_URL_PATTERN)]
BASE_URL_DESCRIPTION = "OpenAI-compatible endpoint; OpenRouter (the server's default) when absent."
InferenceTestStatus = JobStatus  # an inference test is a job
ModelStatus = Literal["succeeded", "failed"]


class CreateInferenceTestRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    environment: str = Field(pattern=NAME_PATTERN, description="Environment name, as listed by GET /environments.")
    num_steps: NumSteps = DEFAULT_NUM_STEPS
    group_size: GroupSize = DEFAULT_GROUP_SIZE
    models: ModelIds = Field(default_factory=lambda: list(DEFAULT_MODELS))
    base_url: BaseUrl | None = Field(
        None, description=f"{BASE_URL_DESCRIPTION} Keys come from the server's settings only."
    )
    config: dict[str, Any] = Field(
        default_factory=dict, description="Edits of the environment's configurable fields for this test."
    )
    timeout_s: float | None = Field(
        None, gt=0, le=86400, description="Time each model may take; the server's default when absent."
    )


class StepResult(BaseModel):
    step: int
    completions: int
    correct: int = Field(description="Completions whose score is above 0.")
    scores: list[float]


class Latency(BaseModel):
    p50_s: float | None = Field(description="Median seconds per completion (the request that returned it).")
    p95_s: float | None
    mean_s: float | None
    completions_timed: int


class ModelResult(BaseModel):
    model: str
    status: ModelStatus
    steps: list[StepResult]
    steps_tested: int
    total_completions: int
    correct_completions: int
    accuracy: float
    steps_with_correct: int
    step_success_rate: float
    latency: Latency
    error: str | None
    wall_time_s: float
    files: ServerPaths = Field(description="`jsonl` (one line per step) and `log` of this model's run.")


class InferenceTestSummary(BaseModel):
    steps_requested: int
    models_tested: int
    models_succeeded: int
    best_model: str | None
    avg_accuracy: float | None = Field(description="Mean accuracy of the models that succeeded.")
    environment_working: bool = Field(description="At least one model's completions were all produced and scored.")
    output_directory: ServerPath


class InferenceTestResult(BaseModel):
    environment: str
    base_url: str
    num_steps: int
    group_size: int
    models_tested: list[ModelResult]
    summary: InferenceTestSummary


class InferenceTestOut(BaseModel):
    id: str
    environment: str
    status: InferenceTestStatus
    progress: JobProgress = Field(description="Steps accounted for over all models: done / (num_steps × models).")
    num_steps: int
    group_size: int
    models: list[str]
    base_url: str
    config: dict[str, Any]
    timeout_s: float
    result: InferenceTestResult | None = Field(description="Per-model results and the summary, once it has run.")
    error: str | None = Field(description="Why the test could not run to its end.")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class InferenceTestList(BaseModel):
    inference_tests: list[InferenceTestOut]
    count: int
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")
