"""One prompt's group, judged: the `judge` and `completion` rewards of its records (docs/TRAJECTORIES.md#judge).

Shared by dataset scoring (every stored group of a dataset), an online dataset run (each group of the policy's
own completions) and an evaluation (each model's completions of a prompt): the calls to the judge, what each
record's values become, and a fresh group's weighted rewards are decided here only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlctl.judging.client import CachedJudge
from rlctl.trajectories.judge import (
    COMPLETION_REWARD,
    COMPLETION_RUBRIC,
    JUDGE_REWARD,
    MAX_JUDGE_GROUP,
    JudgeVerdict,
    completion_by_rule,
    completion_from_judge,
)
from rlctl.trajectories.records import TrajectoryRecord
from rlctl.trajectories.rewards import DecidedReward, Unscored, WeightedReward, score_record
from rlctl.trajectories.stats import tool_stats

JUDGE_FAILED = "judge_failed"
NO_JUDGE = "no_judge"
NO_PROMPT = "no_prompt"


@dataclass
class Decided:
    """One record's group rewards: the value by reward name (None: unscored, for the reason in `why`)."""

    values: dict[str, float | None] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)  # the judge's short reason, by reward name
    completion_by: str | None = None  # "rule" or "judge": who decided `completion`

    def reward(self, name: str) -> DecidedReward:
        """The decided value as a reward function (it raises `Unscored` when the value is None)."""
        return DecidedReward(name, self.values.get(name), self.why.get(name, "unscored"))


@dataclass
class GroupDecision:
    """What the judge said of one group of `size` records, in record order; None where not asked for."""

    size: int
    judged: list[JudgeVerdict | None] | None = None
    rules: list[float | None] | None = None  # completion by rule; None entries are the judge's to decide
    completion: list[JudgeVerdict | None] | None = None  # the judge's, for the records without a rule, in order


def completion_rule(record: TrajectoryRecord) -> float | None:
    failed = sum(counts.failure for counts in tool_stats(record).values())
    return completion_by_rule(record, failed)


def _chunks(items: Sequence[TrajectoryRecord]) -> Iterator[Sequence[TrajectoryRecord]]:
    """A group larger than one judge call holds is judged in consecutive chunks (relative within a chunk)."""
    for start in range(0, len(items), MAX_JUDGE_GROUP):
        yield items[start : start + MAX_JUDGE_GROUP]


def judge_in_chunks(judge: CachedJudge, records: Sequence[TrajectoryRecord], rubric: str) -> list[JudgeVerdict | None]:
    verdicts: list[JudgeVerdict | None] = []
    for chunk in _chunks(records):
        found = judge.judge(chunk, rubric)
        verdicts.extend(found if found is not None else [None] * len(chunk))
    return verdicts


def decide_group(
    judge: CachedJudge | None,
    records: Sequence[TrajectoryRecord],
    names: Sequence[str],
    rubric: str,
    rules: list[float | None] | None,
) -> GroupDecision:
    """The judge's calls for one group: `judge` against `rubric`; `completion` against COMPLETION_RUBRIC for the
    records that `rules` (completion by rule, given when `completion` is asked for) leaves undecided."""
    decision = GroupDecision(len(records), rules=rules)
    if judge is None:
        return decision
    if JUDGE_REWARD in names:
        decision.judged = judge_in_chunks(judge, records, rubric)
    if rules is not None and any(rule is None for rule in rules):
        unruled = [record for record, rule in zip(records, rules, strict=True) if rule is None]
        decision.completion = judge_in_chunks(judge, unruled, COMPLETION_RUBRIC)
    return decision


def record_outcomes(decision: GroupDecision, names: Sequence[str], judge_configured: bool) -> list[Decided]:
    """Each record's values: the judge's score, or None with `judge_failed` (`no_judge` without a judge);
    completion by rule, else the judge's verdict on the 0/1/2 scale, else None likewise."""
    outcomes = [Decided() for _ in range(decision.size)]
    missing = JUDGE_FAILED if judge_configured else NO_JUDGE
    if JUDGE_REWARD in names:
        for index, outcome in enumerate(outcomes):
            verdict = decision.judged[index] if decision.judged is not None else None
            outcome.values[JUDGE_REWARD] = verdict.score if verdict else None
            if verdict is None:
                outcome.why[JUDGE_REWARD] = missing
            else:
                outcome.reasons[JUDGE_REWARD] = verdict.reason
    if decision.rules is not None:
        verdicts = iter(decision.completion or [])
        for outcome, rule in zip(outcomes, decision.rules, strict=True):
            if rule is not None:
                outcome.values[COMPLETION_REWARD], outcome.completion_by = rule, "rule"
                continue
            verdict = next(verdicts, None)
            outcome.values[COMPLETION_REWARD] = completion_from_judge(verdict) if verdict else None
            if verdict is None:
                outcome.why[COMPLETION_REWARD] = missing
            else:
                outcome.reasons[COMPLETION_REWARD], outcome.completion_by = verdict.reason, "judge"
    return outcomes


def judge_fresh_group(
    judge: CachedJudge, records: Sequence[TrajectoryRecord], names: Sequence[str], rubric: str
) -> list[Decided]:
    """The group rewards of one prompt's fresh completions (a policy's, a model's): a completion states no outcome
    of a source, so the judge decides `completion` wherever its rule says nothing. Blocking: the judge's calls."""
    rules = [completion_rule(record) for record in records] if COMPLETION_REWARD in names else None
    return record_outcomes(decide_group(judge, records, names, rubric, rules), names, judge_configured=True)


def weighted_scores(
    records: Sequence[TrajectoryRecord],
    spec: Sequence[Mapping[str, Any]],
    plain: Mapping[str, WeightedReward],
    outcomes: Sequence[Decided] | None,
) -> list[float] | None:
    """Each record's reward, the weighted sum of `spec` (`[{"name", "weight"}]`, in order): a plain reward from
    `plain` by name, a group reward from the record's `outcomes` (judge_fresh_group's, in record order). None when
    a group reward could not be decided for one of them (the judge failed): the whole group is unscored, never 0."""
    scores = []
    for index, record in enumerate(records):
        outcome = outcomes[index] if outcomes is not None else Decided()  # nothing decided: a group reward is unscored
        weighted = [
            plain[entry["name"]]
            if entry["name"] in plain
            else WeightedReward(outcome.reward(entry["name"]), float(entry.get("weight", 1.0)))
            for entry in spec
        ]
        try:
            scores.append(score_record(record, weighted).reward)
        except Unscored:
            return None
    return scores


def judged_scores(
    judge: CachedJudge, records: Sequence[TrajectoryRecord], rubric: str, plain: Sequence[float], weight: float
) -> list[float] | None:
    """A tool environment's episodes of one task, judged as one group against `rubric`: each episode's score is its
    own rewards' sum (`plain`) plus `weight` times the judge's score. None when the judge could not score the group:
    it is left out (of training, of an evaluation's mean), never 0. Blocking: the judge's calls."""
    scores = []
    for own, verdict in zip(plain, judge_in_chunks(judge, records, rubric), strict=True):
        if verdict is None:
            return None
        scores.append(own + weight * verdict.score)
    return scores
