"""GRPO export: grouping by prompt, group-relative advantages, and every left-out record reported."""

from __future__ import annotations

import json
import statistics

import pytest

from rlctl.trajectories.grpo import (
    MISSING_REWARD,
    NO_PROMPT,
    TOO_SMALL,
    ZERO_VARIANCE,
    GroupIssue,
    GrpoExportStats,
    GrpoGroup,
    UnsortedGroupsError,
    group_advantages,
    group_key,
    grpo_groups,
    prompt_text,
)
from rlctl.trajectories.records import TrajectoryRecord, Turn, record_from_dict
from rlctl.trajectories.rewards import SourceReward, WeightedReward, scored


def sorted_pairs(records: list[TrajectoryRecord], metadata_key: str | None = None) -> list:
    return sorted(((group_key(r, metadata_key), r) for r in records), key=lambda pair: pair[0] or "")


def test_tau_bench_trials_form_one_group_per_task_with_advantages(real_records) -> None:
    records = [scored(r, [WeightedReward(SourceReward())]) for r in real_records["tau-bench-gpt-4o-airline.json"]]
    outcomes = list(grpo_groups(sorted_pairs(records, "task_id"), metadata_key="task_id"))
    groups = [o for o in outcomes if isinstance(o, GrpoGroup)]
    assert len(groups) == 3 and not [o for o in outcomes if isinstance(o, GroupIssue)]
    assert sum(len(g.records) for g in groups) == 11
    assert sorted({len(g.records) for g in groups}) == [3, 4]  # trials 0-2, plus trial 3 for two of the three tasks
    for group in groups:
        assert len({r.metadata["task_id"] for r in group.records}) == 1
        assert sum(group.advantages) == pytest.approx(0.0, abs=1e-9)
        assert group.advantages == pytest.approx([r - statistics.fmean(group.rewards) for r in group.rewards])
    line = json.loads(json.dumps(groups[0].as_dict()))
    assert line["size"] == len(line["trajectories"]) == len(line["advantages"])
    trajectory = dict(line["trajectories"][0])
    assert trajectory.pop("advantage") == line["advantages"][0]
    assert record_from_dict(trajectory) == groups[0].records[0]


def test_grouping_by_first_human_turn_reports_groups_of_one(real_records) -> None:
    """The simulated user words each tau-bench trial differently, so prompts rarely repeat: those records are
    reported as too small, never silently kept."""
    records = [scored(r, [WeightedReward(SourceReward())]) for r in real_records["tau-bench-gpt-4o-airline.json"]]
    stats = GrpoExportStats()
    for outcome in grpo_groups(sorted_pairs(records)):
        stats.add(outcome)
        if isinstance(outcome, GroupIssue):
            assert outcome.reason == TOO_SMALL and outcome.size == 1
    summary = stats.as_dict()
    assert summary["records"] + summary["records_not_exported"] == 11
    assert summary["issues"][TOO_SMALL] > 0


def record(prompt: str | None, reward: float | None) -> TrajectoryRecord:
    turns = ((Turn("human", prompt),) if prompt is not None else ()) + (Turn("gpt", "answer"),)
    return TrajectoryRecord(turns=turns, reward=reward)


def test_missing_rewards_and_prompts_are_reported() -> None:
    records = [record("a", 1.0), record("a", None), record("a", 0.0), record(None, 1.0)]
    outcomes = list(grpo_groups(sorted_pairs(records)))
    issues = {(o.reason, o.size) for o in outcomes if isinstance(o, GroupIssue)}
    assert issues == {(MISSING_REWARD, 1), (NO_PROMPT, 1)}
    [group] = [o for o in outcomes if isinstance(o, GrpoGroup)]
    assert group.prompt == "a" and group.rewards == (1.0, 0.0) and group.advantages == (0.5, -0.5)


def test_std_normalisation_and_zero_variance_groups() -> None:
    assert group_advantages((1.0, 0.0, 0.0, 1.0), normalize_by_std=True) == (1.0, -1.0, -1.0, 1.0)
    assert group_advantages((2.0, 2.0), normalize_by_std=True) == (0.0, 0.0)
    equal = [record("p", 1.0), record("p", 1.0)]
    [kept] = list(grpo_groups(sorted_pairs(equal)))
    assert isinstance(kept, GrpoGroup) and kept.as_dict()["all_equal"] is True
    [dropped] = list(grpo_groups(sorted_pairs(equal), drop_zero_variance=True))
    assert isinstance(dropped, GroupIssue) and dropped.reason == ZERO_VARIANCE and dropped.size == 2


def test_unsorted_input_is_refused_rather_than_split_into_groups() -> None:
    pairs = sorted_pairs([record("a", 1.0), record("a", 0.0), record("b", 1.0), record("b", 0.0)])
    with pytest.raises(UnsortedGroupsError):
        list(grpo_groups([pairs[0], pairs[2], pairs[1], pairs[3]]))


def test_demonstrations_before_the_task_are_part_of_the_prompt(real_records) -> None:
    record = real_records["swe-agent-pydicom-1458.traj"][0]
    prompt = prompt_text(record) or ""
    assert "--- DEMONSTRATION ---" in prompt and "Pixel Representation" in prompt
