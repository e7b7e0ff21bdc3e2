"""The pure parts of the judge and completion rewards: prompt, answer parsing, cache key, completion rule,
calibration figures, and composition with the other rewards (docs/TRAJECTORIES.md#judge)."""

from __future__ import annotations

import json

import pytest

from rlctl.trajectories.importing import ImportedRecord, import_item
from rlctl.trajectories.judge import (
    COMPLETION_RUBRIC,
    DEFAULT_RUBRIC,
    MAX_REASON_CHARS,
    MAX_TRAJECTORY_CHARS,
    JudgeReplyError,
    JudgeVerdict,
    cache_key,
    calibration,
    completion_by_rule,
    completion_from_judge,
    content_hash,
    judge_messages,
    parse_judge_reply,
    spearman,
)
from rlctl.trajectories.reading import RawItem
from rlctl.trajectories.records import TrajectoryRecord, Turn
from rlctl.trajectories.rewards import DecidedReward, FormatReward, Unscored, WeightedReward, scored


def record(answer: str, completed: bool | None = None, prompt: str = "What is 2+3?") -> TrajectoryRecord:
    return TrajectoryRecord(turns=(Turn("human", prompt), Turn("gpt", answer)), completed=completed)


def test_the_prompt_holds_the_task_once_each_trajectory_and_the_rubric() -> None:
    long = "x" * (MAX_TRAJECTORY_CHARS * 2)
    messages = judge_messages([record("5"), record(long)], "Prefer short answers.")
    system, user = messages[0]["content"], messages[1]["content"]
    assert "Prefer short answers." in system and "each of the 2 trajectories" in system
    assert user.count("What is 2+3?") == 1 and '<trajectory id="1">\n[gpt] 5\n</trajectory>' in user
    assert len(user) < MAX_TRAJECTORY_CHARS + 500 and "characters left out" in user
    assert "score" in DEFAULT_RUBRIC.lower() and "completed" in COMPLETION_RUBRIC


def test_answers_are_parsed_in_order_from_json_a_fence_or_text() -> None:
    scores = {"scores": [{"trajectory_id": "2", "score": 0, "reason": "wrong"}, {"trajectory_id": 1, "score": 1}]}
    for text in (json.dumps(scores), f"```json\n{json.dumps(scores)}\n```", f"Here: {json.dumps(scores)} done."):
        assert parse_judge_reply(text, 2) == [JudgeVerdict(1.0, ""), JudgeVerdict(0.0, "wrong")]
    reason = parse_judge_reply(json.dumps({"scores": [{"trajectory_id": "1", "score": 0.5, "reason": "r" * 999}]}), 1)
    assert len(reason[0].reason) == MAX_REASON_CHARS


@pytest.mark.parametrize(
    "answer",
    [
        "no json here",
        '{"verdict": 1}',
        '{"scores": [{"trajectory_id": "1", "score": 1.5}, {"trajectory_id": "2", "score": 0}]}',
        '{"scores": [{"trajectory_id": "1", "score": "high"}, {"trajectory_id": "2", "score": 0}]}',
        '{"scores": [{"trajectory_id": "1", "score": 1}]}',
        '{"scores": [{"trajectory_id": "1", "score": 1}, {"trajectory_id": "1", "score": 0}]}',
        '{"scores": [{"trajectory_id": "1", "score": 1}, {"trajectory_id": "3", "score": 0}]}',
        '{"scores": [{"trajectory_id": "1", "score": true}, {"trajectory_id": "2", "score": 0}]}',
    ],
)
def test_an_answer_that_is_not_one_score_per_trajectory_is_refused(answer: str) -> None:
    with pytest.raises(JudgeReplyError):
        parse_judge_reply(answer, 2)


def test_the_cache_key_changes_with_model_rubric_and_any_trajectory() -> None:
    hashes = [content_hash(record("5")), content_hash(record("7"))]
    key = cache_key("m", "r", hashes)
    assert key == cache_key("m", "r", [content_hash(record("5")), content_hash(record("7"))])
    assert (
        len({key, cache_key("m2", "r", hashes), cache_key("m", "r2", hashes), cache_key("m", "r", hashes[::-1])}) == 4
    )
    # metadata and earlier rewards are not what the judge sees
    assert content_hash(record("5")) == content_hash(TrajectoryRecord(record("5").turns, metadata={"a": 1}, reward=3))


def test_completion_follows_the_source_else_the_judge() -> None:
    assert completion_by_rule(record("done", completed=True), failed_tool_calls=0) == 2.0
    assert completion_by_rule(record("done", completed=True), failed_tool_calls=1) == 1.0
    assert completion_by_rule(record("stuck", completed=False), failed_tool_calls=0) == 0.0
    assert completion_by_rule(record("done"), failed_tool_calls=0) is None
    assert [completion_from_judge(JudgeVerdict(s, "")) for s in (0.0, 0.2, 0.5, 0.7, 0.8, 1.0)] == [0, 0, 1, 1, 2, 2]


def test_a_batch_runner_record_states_completion() -> None:
    item = {"trajectory": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "bye"}], "completed": False}
    imported = import_item(RawItem(1, item))
    assert isinstance(imported, ImportedRecord)
    assert imported.record.completed is False  # so the rule, not the judge, scores it


def test_decided_rewards_compose_with_the_others_and_an_undecided_one_leaves_the_record_unscored() -> None:
    rewards = [WeightedReward(DecidedReward("completion", 2.0), 0.5), WeightedReward(FormatReward(), 1.0)]
    done = scored(record("<think>sure</think>5"), rewards, {"completion": "finished"})
    assert done.reward == 1.25 and done.reward_breakdown == {"completion": 2.0, "format": 0.25}
    assert done.reward_reasons == {"completion": "finished"}
    with pytest.raises(Unscored) as failed:
        scored(record("5"), [WeightedReward(DecidedReward("judge", None, "judge_failed"))])
    assert failed.value.reason == "judge_failed"


def test_calibration_counts_agreeing_pairs_within_groups() -> None:
    result = calibration("correctness", [([0.9, 0.1, 0.9], [2, 0, 0]), ([0.2, 0.8], [2, 0]), ([0.5, 0.5], [1, 1])])
    figures = result.as_dict()
    # group 1: (0,1) agrees, (0,2) a judge tie: 1.5 of 2; group 2: disagrees, 0 of 1; group 3: no pair differs
    assert figures["pairs"] == 3 and figures["pairwise_agreement"] == pytest.approx(1.5 / 3)
    assert figures["groups"] == 3 and figures["records"] == 7 and figures["spearman_groups"] == 2
    assert figures["spearman_mean"] == pytest.approx((0.5 - 1.0) / 2)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0) and spearman([1, 1], [0, 1]) is None
