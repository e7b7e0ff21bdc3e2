"""Composable reward functions: each maps a record to a number; a weighted list of them scores a record.

Built in: ``correctness`` (2.0 when the expected answer is in the final answer), ``format`` (0.25 for a
<think>…</think> block, 0.25 for a <tool_call>), ``source_reward`` (the reward the source recorded, e.g.
tau-bench's or NeMo Gym's). An environment's own scorer plugs in through ``EnvironmentScorer``, by name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from rlctl.trajectories.records import TrajectoryRecord
from rlctl.trajectories.tags import has_reasoning, has_tool_call_tag, visible_text

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@runtime_checkable
class RewardFunction(Protocol):
    @property
    def name(self) -> str: ...  # read-only, so frozen dataclasses implement it

    def __call__(self, record: TrajectoryRecord) -> float: ...


@runtime_checkable
class EnvironmentScorer(Protocol):
    """An environment's own scoring, e.g. an Atropos environment's answer check, wired in by the service."""

    def score(self, record: TrajectoryRecord) -> float: ...


def final_answer(record: TrajectoryRecord) -> str:
    """The last gpt turn's text outside <think>, <tool_call> and <tool_response> blocks ("" without one)."""
    for turn in reversed(record.turns):
        if turn.role == "gpt":
            return visible_text(turn.value)
    return ""


def answer_matches(expected: Any, answer: str) -> bool:
    """Whether ``expected`` appears in ``answer``: case- and spacing-insensitive for text; numbers must match
    a whole number in the answer (so "2" is not found in "12", and "1,000" equals "1000")."""
    wanted = _normalize(str(expected))
    if not wanted:
        return False
    if _NUMBER.fullmatch(wanted):
        return any(_number_value(found) == _number_value(wanted) for found in _NUMBER.findall(answer))
    return wanted in _normalize(answer)


@dataclass(frozen=True)
class CorrectnessReward:
    answer_key: str = "answer"  # metadata key of the expected answer
    value: float = 2.0
    name: str = "correctness"

    def __call__(self, record: TrajectoryRecord) -> float:
        expected = record.metadata.get(self.answer_key)
        if expected is None:
            return 0.0
        return self.value if answer_matches(expected, final_answer(record)) else 0.0


@dataclass(frozen=True)
class FormatReward:
    think_value: float = 0.25
    tool_call_value: float = 0.25
    name: str = "format"

    def __call__(self, record: TrajectoryRecord) -> float:
        assistant = [turn.value for turn in record.turns if turn.role == "gpt"]
        score = self.think_value if any(has_reasoning(text) for text in assistant) else 0.0
        return score + (self.tool_call_value if any(has_tool_call_tag(text) for text in assistant) else 0.0)


@dataclass(frozen=True)
class SourceReward:
    key: str = "reward"
    name: str = "source_reward"

    def __call__(self, record: TrajectoryRecord) -> float:
        value = record.metadata.get(self.key)
        try:
            return float(value) if value is not None and not isinstance(value, bool) else 0.0
        except (TypeError, ValueError):
            return 0.0


@dataclass(frozen=True)
class EnvironmentReward:
    """Adapts an environment's scorer to a reward function named after the environment."""

    name: str
    scorer: EnvironmentScorer

    def __call__(self, record: TrajectoryRecord) -> float:
        return float(self.scorer.score(record))


class Unscored(Exception):  # noqa: N818 - an outcome, not a fault: the record is kept, unscored and counted
    """A reward that cannot score this record (e.g. its judge failed): the record stays unscored, never 0."""

    def __init__(self, reward: str, reason: str) -> None:
        super().__init__(f"{reward}: {reason}")
        self.reward, self.reason = reward, reason


@dataclass(frozen=True)
class DecidedReward:
    """A value decided before the record is scored, by a step that sees the whole group (the judge, the
    completion score); ``value`` None means it could not be decided, for ``reason``."""

    name: str
    value: float | None
    reason: str = "unscored"

    def __call__(self, record: TrajectoryRecord) -> float:
        if self.value is None:
            raise Unscored(self.name, self.reason)
        return self.value


@dataclass(frozen=True)
class WeightedReward:
    function: RewardFunction
    weight: float = 1.0


@dataclass(frozen=True)
class RewardResult:
    reward: float  # the weighted sum
    breakdown: dict[str, float]  # each function's unweighted value, by name


def score_record(record: TrajectoryRecord, rewards: Sequence[WeightedReward]) -> RewardResult:
    names = [weighted.function.name for weighted in rewards]
    if len(set(names)) != len(names):
        raise ValueError(f"reward function names must be unique: {names}")
    breakdown = {weighted.function.name: float(weighted.function(record)) for weighted in rewards}
    total = sum(weighted.weight * breakdown[weighted.function.name] for weighted in rewards)
    return RewardResult(reward=total, breakdown=breakdown)


def scored(
    record: TrajectoryRecord, rewards: Sequence[WeightedReward], reasons: dict[str, str] | None = None
) -> TrajectoryRecord:
    """The record with ``reward`` and ``reward_breakdown`` set (and the judge's ``reward_reasons`` when given);
    raises ``Unscored`` when one of the rewards cannot score it."""
    result = score_record(record, rewards)
    return replace(record, reward=result.reward, reward_breakdown=result.breakdown, reward_reasons=reasons or None)


BUILTIN_REWARDS: dict[str, Callable[..., RewardFunction]] = {
    "correctness": CorrectnessReward,
    "format": FormatReward,
    "source_reward": SourceReward,
}


def build_rewards(
    spec: Sequence[Mapping[str, Any]], scorers: Mapping[str, EnvironmentScorer] | None = None
) -> list[WeightedReward]:
    """Reward functions from a spec like ``[{"name": "correctness", "weight": 1.0, "params": {...}}]``.

    A name that is not built in must be one of ``scorers`` (environment scorers, by environment name).
    """
    scorers = scorers or {}
    built = []
    for entry in spec:
        name, weight, params = entry.get("name"), entry.get("weight", 1.0), entry.get("params") or {}
        if not isinstance(name, str) or name not in {*BUILTIN_REWARDS, *scorers}:
            known = sorted([*BUILTIN_REWARDS, *scorers])
            raise ValueError(f"unknown reward function {name!r}; known: {', '.join(known)}")
        function: RewardFunction
        if name in BUILTIN_REWARDS:
            function = BUILTIN_REWARDS[name](**params)
        else:
            function = EnvironmentReward(name=name, scorer=scorers[name])
        built.append(WeightedReward(function, float(weight)))
    return built


def _normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def _number_value(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None
