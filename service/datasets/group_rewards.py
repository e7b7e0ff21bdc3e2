"""The rewards a record cannot get alone: `judge` (a judge model scores each prompt's group of trajectories
relative to each other) and `completion` (the seed's 0/1/2 task-completion score, by rule where the source states
completion, else by the judge). Decided in a pass over the groups before the records are scored, so the scoring
pass stays one record at a time (docs/TRAJECTORIES.md#judge).

Memory: the decided values (a number and a reason of at most 300 characters per record) for the whole dataset,
plus the groups in flight (2 × `RLCTL_JUDGE_CONCURRENCY`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any

from service.datasets.judge_client import CachedJudge, JudgeClient, judge_endpoint
from service.datasets.store import read_line_at
from service.db.engine import Database
from service.settings import Settings
from trajectories.judge import (
    COMPLETION_REWARD,
    COMPLETION_RUBRIC,
    DEFAULT_RUBRIC,
    JUDGE_REWARD,
    MAX_JUDGE_GROUP,
    Calibration,
    JudgeVerdict,
    completion_by_rule,
    completion_from_judge,
)
from trajectories.records import TrajectoryRecord, record_from_dict
from trajectories.rewards import RewardFunction
from trajectories.stats import tool_stats

JUDGE_FAILED = "judge_failed"
NO_JUDGE = "no_judge"
NO_PROMPT = "no_prompt"


@dataclass
class Decided:
    """One record's group rewards: the value by reward name (None: unscored, for the reason in `why`)."""

    values: dict[str, float | None] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)  # the judge's short reason, by reward name


def completion_rule(record: TrajectoryRecord) -> float | None:
    failed = sum(counts.failure for counts in tool_stats(record).values())
    return completion_by_rule(record, failed)


def make_judge(settings: Settings, database: Database, model: str, scrub: Callable[[str], str]) -> CachedJudge | None:
    endpoint = judge_endpoint(settings)
    if endpoint is None:
        return None
    base_url, key = endpoint
    client = JudgeClient(
        base_url, key, model, scrub, max_retries=settings.judge_max_retries, timeout_s=settings.judge_timeout_s
    )
    return CachedJudge(client, database)


def _chunks(items: list[Any]) -> Iterator[list[Any]]:
    """A group larger than one judge call holds is judged in consecutive chunks (relative within a chunk)."""
    for start in range(0, len(items), MAX_JUDGE_GROUP):
        yield items[start : start + MAX_JUDGE_GROUP]


class GroupRewards:
    """Decides `judge` and `completion` for every record of a dataset, by byte offset."""

    def __init__(
        self,
        names: list[str],
        judge: CachedJudge | None,
        rubric: str | None,
        reference: tuple[str, RewardFunction] | None,
    ) -> None:
        self.names, self.judge = names, judge
        self.rubric = rubric or DEFAULT_RUBRIC
        self.reference = reference
        self.calibration = Calibration(reference[0]) if reference else None
        self.decided: dict[int, Decided] = {}
        self.completion_by = {"rule": 0, "judge": 0}

    def groups(self, records: Path, sorted_pairs: Iterator[tuple[str, int]]) -> Iterator[list[tuple[int, Any]]]:
        """Each prompt's records as (offset, record) pairs, read from the sorted (key, offset) pairs."""
        with records.open("rb") as handle:
            for _, pairs in groupby(sorted_pairs, key=lambda pair: pair[0]):
                yield [(offset, record_from_dict(json.loads(read_line_at(handle, offset)))) for _, offset in pairs]

    def prepare(self, group: list[tuple[int, TrajectoryRecord]]) -> dict[str, Any]:
        """What a group needs from this thread (a reference reward may be an environment's child process)."""
        known = [float(self.reference[1](record)) for _, record in group] if self.reference else None
        rules = [completion_rule(record) for _, record in group] if COMPLETION_REWARD in self.names else None
        return {"group": group, "known": known, "rules": rules}

    def decide(self, prepared: dict[str, Any]) -> dict[str, Any]:
        """The judge's calls for one group (run in a worker thread)."""
        group: list[tuple[int, TrajectoryRecord]] = prepared["group"]
        prepared["judged"] = None
        prepared["completion"] = None
        if self.judge is None:
            return prepared
        if JUDGE_REWARD in self.names:
            prepared["judged"] = self._judge([record for _, record in group], self.rubric)
        rules = prepared["rules"]
        if rules is not None and any(rule is None for rule in rules):
            unruled = [record for (_, record), rule in zip(group, rules, strict=True) if rule is None]
            prepared["completion"] = self._judge(unruled, COMPLETION_RUBRIC)
        return prepared

    def _judge(self, records: list[TrajectoryRecord], rubric: str) -> list[JudgeVerdict | None]:
        assert self.judge is not None
        verdicts: list[JudgeVerdict | None] = []
        for chunk in _chunks(records):
            found = self.judge.judge(chunk, rubric)
            verdicts.extend(found if found is not None else [None] * len(chunk))
        return verdicts

    def accept(self, decided: dict[str, Any]) -> None:
        """Records a group's outcome (in this thread), and adds it to the calibration."""
        group: list[tuple[int, TrajectoryRecord]] = decided["group"]
        outcomes = [Decided() for _ in group]
        if JUDGE_REWARD in self.names:
            judged = decided["judged"]
            for index, outcome in enumerate(outcomes):
                verdict = judged[index] if judged is not None else None
                outcome.values[JUDGE_REWARD] = verdict.score if verdict else None
                if verdict is None:
                    outcome.why[JUDGE_REWARD] = NO_JUDGE if self.judge is None else JUDGE_FAILED
                else:
                    outcome.reasons[JUDGE_REWARD] = verdict.reason
            if self.calibration is not None and judged is not None:
                pairs = [(v.score, k) for v, k in zip(judged, decided["known"], strict=True) if v is not None]
                if len(pairs) >= 2:
                    self.calibration.add_group([p[0] for p in pairs], [p[1] for p in pairs])
        if decided["rules"] is not None:
            verdicts = iter(decided["completion"] or [])
            for outcome, rule in zip(outcomes, decided["rules"], strict=True):
                if rule is not None:
                    outcome.values[COMPLETION_REWARD] = rule
                    self.completion_by["rule"] += 1
                    continue
                verdict = next(verdicts, None) if self.judge is not None else None
                outcome.values[COMPLETION_REWARD] = completion_from_judge(verdict) if verdict else None
                if verdict is None:
                    outcome.why[COMPLETION_REWARD] = NO_JUDGE if self.judge is None else JUDGE_FAILED
                else:
                    outcome.reasons[COMPLETION_REWARD] = verdict.reason
                    self.completion_by["judge"] += 1
        for (offset, _), outcome in zip(group, outcomes, strict=True):
            self.decided[offset] = outcome

    def for_record(self, offset: int, record: TrajectoryRecord) -> Decided:
        """A record outside every group (it has no prompt): completion by rule only; the judge has no group."""
        found = self.decided.get(offset)
        if found is not None:
            return found
        outcome = Decided()
        if JUDGE_REWARD in self.names:
            outcome.values[JUDGE_REWARD], outcome.why[JUDGE_REWARD] = None, NO_PROMPT
        if COMPLETION_REWARD in self.names:
            rule = completion_rule(record)
            outcome.values[COMPLETION_REWARD] = rule
            if rule is None:
                outcome.why[COMPLETION_REWARD] = NO_PROMPT
        return outcome

    def report(self) -> dict[str, Any]:
        report: dict[str, Any] = {}
        if self.judge is not None:
            report["judge"] = {"model": self.judge.client.model, **self.judge.counters.as_dict()}
        if COMPLETION_REWARD in self.names:
            report["completion_by"] = dict(self.completion_by)
        if self.calibration is not None:
            report["calibration"] = self.calibration.as_dict()
        return report

    def close(self) -> None:
        if self.judge is not None:
            self.judge.close()
