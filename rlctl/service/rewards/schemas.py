"""HTTP models of rewards: the rewards a request names and the judge it asks, shared by dataset scoring, online
dataset runs and evaluations."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from rlctl.service.names import NAME_PATTERN
from rlctl.trajectories.judge import MAX_RUBRIC_CHARS


class RewardSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        pattern=NAME_PATTERN,
        description="correctness, format, source_reward, judge, completion, or an environment with a scorer "
        "(e.g. gsm8k).",
    )
    weight: float = Field(1.0, ge=-1000, le=1000)


class JudgeChoice(BaseModel):
    """The judge model and rubric of the `judge` and `completion` rewards (docs/TRAJECTORIES.md#judge); an
    online dataset run's judge (docs/RUNS.md#training-on-a-dataset)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(
        None, min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$", description="Default: RLCTL_JUDGE_MODEL."
    )
    rubric: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_RUBRIC_CHARS,
        description="What makes a trajectory better; default: the docs' rubric.",
    )
