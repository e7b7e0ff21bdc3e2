"""GRPO export: records grouped by prompt, each with its reward and group-relative advantage.

Streaming: the caller sorts ``(group_key(record), record)`` pairs by key (e.g. on disk) and passes them in
that order; only one group is held in memory. Groups too small to compare, records without a reward and
(optionally) groups whose rewards are all equal are reported as ``GroupIssue`` values, never silently kept or
dropped.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from rlctl.trajectories.records import TrajectoryRecord, record_to_dict

TOO_SMALL = "too_small"
MISSING_REWARD = "missing_reward"
ZERO_VARIANCE = "zero_variance"
NO_PROMPT = "no_prompt"


class UnsortedGroupsError(ValueError):
    """The pairs were not sorted by key, so a group would be split."""


@dataclass(frozen=True)
class GrpoGroup:
    key: str
    prompt: str
    records: tuple[TrajectoryRecord, ...]
    rewards: tuple[float, ...]
    advantages: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.rewards)

    @property
    def std(self) -> float:
        return statistics.pstdev(self.rewards)

    def as_dict(self) -> dict[str, Any]:
        """One JSON line of the export."""
        return {
            "group_key": self.key,
            "prompt": self.prompt,
            "size": len(self.records),
            "rewards": list(self.rewards),
            "advantages": list(self.advantages),
            "reward_mean": self.mean,
            "reward_std": self.std,
            "all_equal": self.std == 0,
            "trajectories": [
                {**record_to_dict(record), "advantage": advantage}
                for record, advantage in zip(self.records, self.advantages, strict=True)
            ],
        }


@dataclass(frozen=True)
class GroupIssue:
    key: str | None
    reason: str
    size: int
    detail: str = ""


def prompt_text(record: TrajectoryRecord, metadata_key: str | None = None) -> str | None:
    """What the group shares: ``metadata[metadata_key]`` when a key is given, else the human turns before
    the first gpt turn (usually just the first human turn; some agents put demonstrations first)."""
    if metadata_key is not None:
        value = record.metadata.get(metadata_key)
        if value is None:
            return None
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
    before_answer = []
    for turn in record.turns:
        if turn.role == "gpt":
            break
        if turn.role == "human":
            before_answer.append(turn.value)
    return "\n\n".join(before_answer) if before_answer else None


def group_key(record: TrajectoryRecord, metadata_key: str | None = None) -> str | None:
    """A short, stable, sortable key for the record's prompt (SHA-256 of it), None without a prompt."""
    prompt = prompt_text(record, metadata_key)
    return hashlib.sha256(prompt.encode()).hexdigest() if prompt is not None else None


def grpo_groups(
    keyed_records: Iterable[tuple[str | None, TrajectoryRecord]],
    metadata_key: str | None = None,
    normalize_by_std: bool = False,
    min_group_size: int = 2,
    drop_zero_variance: bool = False,
) -> Iterator[GrpoGroup | GroupIssue]:
    """Groups and issues from pairs sorted by key (records without a prompt, key None, may come anywhere)."""
    previous: str | None = None
    for key, pairs in groupby(keyed_records, key=lambda pair: pair[0]):
        records = [record for _, record in pairs]
        if key is None:
            yield GroupIssue(None, NO_PROMPT, len(records), "records without a prompt cannot be grouped")
            continue
        if previous is not None and key <= previous:
            raise UnsortedGroupsError(f"group key {key} came after {previous}; sort the records by group key")
        previous = key
        yield from _group_or_issues(key, records, metadata_key, normalize_by_std, min_group_size, drop_zero_variance)


def _group_or_issues(
    key: str,
    records: list[TrajectoryRecord],
    metadata_key: str | None,
    normalize_by_std: bool,
    min_group_size: int,
    drop_zero_variance: bool,
) -> Iterator[GrpoGroup | GroupIssue]:
    unscored = [record for record in records if record.reward is None]
    if unscored:
        yield GroupIssue(key, MISSING_REWARD, len(unscored), "score the records before exporting them")
    scored = [record for record in records if record.reward is not None]
    if not scored:
        return
    if len(scored) < min_group_size:
        yield GroupIssue(key, TOO_SMALL, len(scored), f"a group needs at least {min_group_size} scored records")
        return
    rewards = tuple(float(record.reward) for record in scored if record.reward is not None)
    if drop_zero_variance and len(set(rewards)) == 1:
        yield GroupIssue(key, ZERO_VARIANCE, len(scored), "all rewards are equal: no learning signal")
        return
    yield GrpoGroup(
        key=key,
        prompt=prompt_text(scored[0], metadata_key) or "",
        records=tuple(scored),
        rewards=rewards,
        advantages=group_advantages(rewards, normalize_by_std),
    )


def group_advantages(rewards: Sequence[float], normalize_by_std: bool = False) -> tuple[float, ...]:
    """reward − group mean, divided by the group's standard deviation when asked (and it is not zero). The one
    definition of GRPO advantages, used by the dataset export and the trainer (docs/TRAJECTORIES.md#grpo-advantages).
    """
    mean = statistics.fmean(rewards)
    spread = statistics.pstdev(rewards) if normalize_by_std else 0.0
    return tuple((reward - mean) / spread if spread else reward - mean for reward in rewards)


@dataclass
class GrpoExportStats:
    groups: int = 0
    records: int = 0
    issues: Counter[str] = field(default_factory=Counter)
    records_in_issues: int = 0

    def add(self, outcome: GrpoGroup | GroupIssue) -> None:
        if isinstance(outcome, GrpoGroup):
            self.groups += 1
            self.records += len(outcome.records)
        else:
            self.issues[outcome.reason] += 1
            self.records_in_issues += outcome.size

    def as_dict(self) -> dict[str, Any]:
        return {
            "groups": self.groups,
            "records": self.records,
            "issues": dict(sorted(self.issues.items())),
            "records_not_exported": self.records_in_issues,
        }
