"""Reward functions, their weighted composition, and environment scorers plugged in by name."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from rlctl.trajectories.records import TrajectoryRecord, Turn
from rlctl.trajectories.rewards import (
    CorrectnessReward,
    FormatReward,
    SourceReward,
    WeightedReward,
    answer_matches,
    build_rewards,
    final_answer,
    score_record,
    scored,
)
from rlctl.trajectories.stats import tool_result_failed


def answered(*gpt_values: str, answer: object = None) -> TrajectoryRecord:
    turns = (Turn("human", "What is 6 times 7?"), *(Turn("gpt", value) for value in gpt_values))
    return TrajectoryRecord(turns=turns, metadata={} if answer is None else {"answer": answer})


def test_final_answer_is_the_last_gpt_turns_text_outside_tags() -> None:
    record = answered(
        "<think>maybe 41</think>Let me compute.\n<tool_call>\n{}\n</tool_call>",
        "<think>\nIt is 42.\n</think>\nThe answer is 42.",
    )
    assert final_answer(record) == "The answer is 42."
    assert final_answer(answered("<think>the answer is 42</think>")) == ""
    assert final_answer(TrajectoryRecord(turns=(Turn("human", "hi"),))) == ""


@pytest.mark.parametrize(
    ("expected", "answer", "matches"),
    [
        ("42", "The answer is 42.", True),
        ("2", "The answer is 12.", False),
        ("1000", "It costs 1,000 dollars", True),
        ("-3.5", "x = -3.5", True),
        ("Paris", "the capital is paris", True),
        ("new  york", "New York City", True),
        ("", "anything", False),
        (72, "#### 72", True),
    ],
)
def test_answer_matching(expected: object, answer: str, matches: bool) -> None:
    assert answer_matches(expected, answer) is matches


def test_correctness_scores_two_only_when_the_answer_is_in_the_final_answer() -> None:
    reward = CorrectnessReward()
    assert reward(answered("The answer is 42.", answer="42")) == 2.0
    assert reward(answered("<think>42</think>I do not know.", answer="42")) == 0.0
    assert reward(answered("The answer is 42.")) == 0.0  # no expected answer: nothing to credit
    assert CorrectnessReward(answer_key="gold")(replace(answered("42"), metadata={"gold": 42})) == 2.0


def test_format_scores_a_quarter_for_think_and_a_quarter_for_a_tool_call() -> None:
    reward = FormatReward()
    assert reward(answered("plain")) == 0.0
    assert reward(answered("<think>x</think>ok")) == 0.25
    assert reward(answered("<tool_call>\n{}\n</tool_call>")) == 0.25
    assert reward(answered("<think>x</think>", "<tool_call>\n{}\n</tool_call>")) == 0.5
    assert reward(answered("<think>  </think>ok")) == 0.0  # an empty scratchpad is not reasoning


def test_weighted_sum_and_breakdown_on_a_real_record(real_records) -> None:
    record = real_records["hermes-agent-fork-lucifexia-trajectory-samples.jsonl"][0]
    record = replace(record, metadata={**record.metadata, "answer": "Hello! I am Lucifex Agent."})
    rewards = [WeightedReward(CorrectnessReward()), WeightedReward(FormatReward(), weight=2.0)]
    result = score_record(record, rewards)
    assert result.breakdown == {"correctness": 2.0, "format": 0.25}
    assert result.reward == 2.0 + 2.0 * 0.25
    with_reward = scored(record, rewards)
    assert (with_reward.reward, with_reward.reward_breakdown) == (2.5, result.breakdown)


def test_reasoning_tool_use_demo_earns_full_format_reward(real_records) -> None:
    records = real_records["llamafactory-reason-tool-use-demo-50.jsonl"]
    values = [FormatReward()(record) for record in records]
    with_calls = sum(1 for r in records if any(t.tool_calls for t in r.turns))
    assert values.count(0.5) == with_calls and values.count(0.25) == len(records) - with_calls


def test_source_reward_reads_the_recorded_reward(real_records) -> None:
    tau = real_records["tau-bench-gpt-4o-airline.json"]
    assert [SourceReward()(r) for r in tau] == [float(r.metadata["reward"]) for r in tau]
    newton = real_records["nemo-gym-newton-bench-rollouts.jsonl"]
    assert [SourceReward()(r) for r in newton] == [float(r.metadata["reward"]) for r in newton]
    assert len({SourceReward()(r) for r in newton}) > 2  # real-valued rewards, kept as they are
    assert SourceReward()(TrajectoryRecord(turns=(), metadata={"reward": "n/a"})) == 0.0


@dataclass
class ToolSuccessScorer:
    """An environment-style scorer: the share of tool results that succeeded."""

    def score(self, record: TrajectoryRecord) -> float:
        results = [turn for turn in record.turns if turn.role == "tool"]
        return sum(not tool_result_failed(t) for t in results) / len(results) if results else 0.0


def test_environment_scorers_plug_in_by_name(real_records) -> None:
    spec = [
        {"name": "format", "weight": 1.0},
        {"name": "tau_airline", "weight": 0.5},
        {"name": "correctness", "weight": 1.0, "params": {"answer_key": "expected"}},
    ]
    rewards = build_rewards(spec, scorers={"tau_airline": ToolSuccessScorer()})
    record = real_records["tau-bench-gpt-4o-airline.json"][0]
    result = score_record(record, rewards)
    share = ToolSuccessScorer().score(record)
    assert 0 < share < 1
    assert result.breakdown == {"format": 0.25, "tau_airline": share, "correctness": 0.0}
    assert result.reward == pytest.approx(0.25 + 0.5 * share)


def test_unknown_or_duplicate_reward_functions_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown reward function 'vibes'"):
        build_rewards([{"name": "vibes"}])
    with pytest.raises(ValueError, match="unique"):
        score_record(answered("x"), [WeightedReward(FormatReward()), WeightedReward(FormatReward())])
