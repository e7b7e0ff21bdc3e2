"""HTTP models of evaluations: the base model against a run's checkpoints on the same prompts."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlctl.service.jobs.schemas import JobProgress
from rlctl.service.names import NAME_PATTERN
from rlctl.service.rewards.schemas import JudgeChoice, RewardSpec
from rlctl.service.runs.schemas import PromptSplit
from rlctl.service.schemas import ServerPath
from rlctl.service.states import JobStatus

FIELD_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"


class EvaluationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(pattern=NAME_PATTERN, description="The run whose base model and checkpoints are compared.")
    steps: list[int] | None = Field(
        None, min_length=1, max_length=8, description="Checkpoint steps to compare with the base; default: the newest."
    )
    split: PromptSplit = Field("held_out", description="The run's prompts to answer (GET /runs/{id}/prompts).")
    rewards: list[RewardSpec] | None = Field(
        None, min_length=1, max_length=16, description="How completions are scored; default: the run's own rewards."
    )
    answer_field: str = Field("answer", pattern=FIELD_PATTERN, description="Metadata field of the expected answer.")
    judge: JudgeChoice | None = Field(
        None,
        description="With the judge or completion reward: the judge's model and rubric; default: the run's own "
        "judge (online runs), else RLCTL_JUDGE_MODEL and the docs' rubric.",
    )
    samples_per_prompt: int = Field(
        4, ge=1, le=64, description="Completions (a tool environment's run: episodes) per prompt (task) and model."
    )
    max_prompts: int = Field(
        100,
        ge=1,
        le=1000,
        description="The split's first prompts, at most this many (a tool environment's run: "
        "exactly this many of its held-out tasks).",
    )
    max_tokens: int = Field(
        16,
        ge=1,
        le=4096,
        description="Most tokens of a completion (a tool environment's run: its own per-reply limit).",
    )
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Sampling and bootstrap seed.")


class EvaluationModelResult(BaseModel):
    name: str = Field(description="base, or step_N")
    weights: ServerPath | None = Field(
        description="The checkpoint's weights: a local adapter directory or a tinker:// sampler URI; null for base."
    )
    mean_reward: float | None = Field(
        description="Mean over scored prompts of each prompt's mean reward; null when no prompt could be scored."
    )
    samples: int = Field(description="Completions scored.")
    unscored_prompts: int = Field(
        0, description="Prompts whose group the judge could not score: left out of this model's mean and comparison."
    )
    difference: float | None = Field(description="Mean reward minus the base's, paired by prompt; null for base.")
    interval: list[float] | None = Field(description="95 % percentile bootstrap interval of the difference.")
    win_rate: float | None = Field(description="Share of prompts where this model's mean beats the base's (ties 1/2).")
    wins: int | None = None
    ties: int | None = None
    losses: int | None = None
    turns_per_episode: float | None = Field(
        None, description="A tool environment's run: the model's replies per episode (mean); null otherwise."
    )
    tool_calls_per_episode: float | None = Field(
        None, description="A tool environment's run: tool calls per episode (mean); null otherwise."
    )
    failed_calls_per_episode: float | None = Field(
        None, description="A tool environment's run: failed tool calls per episode (mean); null otherwise."
    )


class PromptResult(BaseModel):
    prompt_index: int
    group_key: str
    rewards: dict[str, float] = Field(description="Model name → mean reward of its samples on this prompt.")
    unscored: list[str] = Field([], description="Models whose samples of this prompt the judge could not score.")


class EvaluationJudge(BaseModel):
    """What the judge did for an evaluation with the judge or completion reward (each model's prompt, one group)."""

    model: str
    groups: int = Field(description="Judge groups asked for (a group over 32 completions counts once per chunk).")
    judge_calls: int
    cache_hits: int
    failed_groups: int
    first_error: str | None = Field(description="The first failure's message, scrubbed of every secret.")


class EvaluationOut(BaseModel):
    id: str
    status: JobStatus
    progress: JobProgress
    request: dict[str, Any]
    models: list[EvaluationModelResult] | None = Field(None, description="Once it has succeeded.")
    prompts: list[PromptResult] | None = Field(None, description="Once it has succeeded: per-prompt results.")
    judge: EvaluationJudge | None = Field(None, description="Once it has succeeded, when the judge scored.")
    error: str | None = None
