"""The rewards a record cannot get alone: `judge` (a judge model scores each prompt's group of trajectories
relative to each other) and `completion` (the seed's 0/1/2 task-completion score, by rule where the source states
completion, else by the judge). Decided in a pass over the groups before the records are scored, so the scoring
pass stays one record at a time (docs/TRAJECTORIES.md#judge).

Memory: the decided values (a number and a reason of at most 300 characters per record) for the whole dataset,
plus the groups in flight (2 × `RLCTL_JUDGE_CONCURRENCY`).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import groupby
from pathlib import Path
from typing import Any

from rlctl.judging.client import CachedJudge
from rlctl.judging.groups import NO_PROMPT, Decided, completion_rule, decide_group, record_outcomes
from rlctl.service.jobs.passes import Progress, ordered_map
from rlctl.service.rewards.grouping import record_at, sorted_group_keys
from rlctl.trajectories.judge import COMPLETION_REWARD, DEFAULT_RUBRIC, JUDGE_REWARD, Calibration
from rlctl.trajectories.records import TrajectoryRecord
from rlctl.trajectories.rewards import RewardFunction


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

    def decide_file(self, records: Path, group_by: str | None, scratch: Path, workers: int, progress: Progress) -> None:
        """Decides every prompt's group of a records file, `workers` groups at once; `scratch` holds the sort's
        spilled runs."""
        pairs, _unkeyed = sorted_group_keys(records, group_by, scratch)
        prepared = (self._prepare(group) for group in self._groups(records, pairs))
        outcomes = ordered_map(self._decide, prepared, workers)
        try:
            for outcome in outcomes:
                self._accept(outcome)
                progress.check_cancelled()
        finally:
            outcomes.close()

    def _groups(
        self, records: Path, sorted_pairs: Iterator[tuple[str, int]]
    ) -> Iterator[list[tuple[int, TrajectoryRecord]]]:
        """Each prompt's records as (offset, record) pairs, read from the sorted (key, offset) pairs."""
        with records.open("rb") as handle:
            for _, pairs in groupby(sorted_pairs, key=lambda pair: pair[0]):
                yield [(offset, record_at(handle, offset)) for _, offset in pairs]

    def _prepare(self, group: list[tuple[int, TrajectoryRecord]]) -> dict[str, Any]:
        """What a group needs from this thread (a reference reward may be an environment's child process)."""
        known = [float(self.reference[1](record)) for _, record in group] if self.reference else None
        rules = [completion_rule(record) for _, record in group] if COMPLETION_REWARD in self.names else None
        return {"group": group, "known": known, "rules": rules}

    def _decide(self, prepared: dict[str, Any]) -> dict[str, Any]:
        """The judge's calls for one group (run in a worker thread)."""
        records = [record for _, record in prepared["group"]]
        prepared["decision"] = decide_group(self.judge, records, self.names, self.rubric, prepared["rules"])
        return prepared

    def _accept(self, decided: dict[str, Any]) -> None:
        """Records a group's outcome (in this thread), and adds it to the calibration."""
        group: list[tuple[int, TrajectoryRecord]] = decided["group"]
        decision = decided["decision"]
        outcomes = record_outcomes(decision, self.names, self.judge is not None)
        if self.calibration is not None and decision.judged is not None:
            pairs = [(v.score, k) for v, k in zip(decision.judged, decided["known"], strict=True) if v is not None]
            if len(pairs) >= 2:
                self.calibration.add_group([p[0] for p in pairs], [p[1] for p in pairs])
        for (offset, _), outcome in zip(group, outcomes, strict=True):
            if outcome.completion_by is not None:
                self.completion_by[outcome.completion_by] += 1
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
