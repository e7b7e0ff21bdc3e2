"""What a tool environment's rewards read off a finished episode: pure functions, no I/O."""

from __future__ import annotations

import re

from rlctl.environment_kit.agents import Episode
from rlctl.environment_kit.tool_env import ToolTask
from rlctl.trajectories.tool_calls import split_tool_calls


def first_number_is(episode: Episode, value: str) -> float:
    """1 when the policy's final answer (its last reply, outside any tool call) has `value` as its first number:
    an answer listing many numbers, which would contain any value, gets nothing."""
    numbers = re.findall(r"\d+", split_tool_calls(episode.final_reply).content)
    return 1.0 if numbers and numbers[0] == value else 0.0


def answer_is_value(task: ToolTask, episode: Episode) -> float:
    """A reward: 1 when the final answer's first number is the task's `data["value"]` (`first_number_is`)."""
    return first_number_is(episode, task.data["value"])
