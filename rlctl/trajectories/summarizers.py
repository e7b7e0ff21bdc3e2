"""Summarisers for trajectory compression: the interface, a deterministic extractive one (no network), and the
prompt a model-backed summariser sends (the client itself lives in `rlctl/service/datasets/summary_client.py`)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from rlctl.trajectories.records import Turn
from rlctl.trajectories.stats import tool_result_failed
from rlctl.trajectories.tags import parse_tagged_tool_response, visible_text

_PROMPT_CHARS_PER_TURN = 3000  # a summary needs the gist of a huge tool output, not all of it


class SummarizationError(RuntimeError):
    """The summariser could not produce a summary (after its retries)."""


@runtime_checkable
class Summarizer(Protocol):
    name: str

    def summarize(self, turns: Sequence[Turn], target_tokens: int) -> str:
        """A summary of ``turns`` of about ``target_tokens`` tokens (the caller trims anything longer)."""
        ...


class ExtractiveSummarizer:
    """Deterministic: a headline of the tools used and failures, then one short line per turn."""

    name = "extractive-v1"
    chars_per_token = 4

    def summarize(self, turns: Sequence[Turn], target_tokens: int) -> str:
        budget = max(target_tokens, 1) * self.chars_per_token
        per_line = min(300, max(40, budget // max(len(turns), 1)))
        lines = [_headline(turns)]
        used = len(lines[0])
        for turn in turns:
            line = _clip(_turn_line(turn), per_line)
            if used + len(line) + 1 > budget:
                lines.append(f"- … {len(turns) - len(lines) + 1} more turns")
                break
            lines.append(line)
            used += len(line) + 1
        return "\n".join(lines)


def summary_prompt(turns: Sequence[Turn], target_tokens: int) -> list[dict[str, str]]:
    instructions = (
        "You summarise the middle part of an AI agent's trajectory; the summary replaces those turns in "
        f"training data. In at most {target_tokens} tokens, state factually what the agent did: the actions "
        "and tool calls, their results, errors and how they were handled, and the facts later turns rely on. "
        "Third person, no preamble."
    )
    transcript = "\n\n".join(f"[{turn.role}]\n{_clip(turn.value, _PROMPT_CHARS_PER_TURN)}" for turn in turns)
    return [{"role": "system", "content": instructions}, {"role": "user", "content": transcript}]


def _headline(turns: Sequence[Turn]) -> str:
    calls = Counter(call.name for turn in turns for call in turn.tool_calls)
    failures = sum(1 for turn in turns if turn.role == "tool" and tool_result_failed(turn))
    parts = [f"{len(turns)} turns summarised."]
    if calls:
        parts.append("Tool calls: " + ", ".join(f"{name} ×{n}" for name, n in sorted(calls.items())) + ".")
    if failures:
        parts.append(f"{failures} tool result(s) failed.")
    return " ".join(parts)


def _turn_line(turn: Turn) -> str:
    if turn.role == "tool":
        wrapper = parse_tagged_tool_response(turn.value)
        content = str(wrapper.get("content", "")) if wrapper else turn.value
        outcome = "failed" if tool_result_failed(turn) else "ok"
        return f"- {turn.name or 'tool'} {outcome}: {_one_line(content)}"
    if turn.role == "gpt":
        said = _one_line(visible_text(turn.value))
        called = "; ".join(f"{call.name}({_one_line(str(call.arguments))[:80]})" for call in turn.tool_calls)
        return "- assistant: " + " | ".join(part for part in (said, f"called {called}" if called else "") if part)
    speaker = "user" if turn.role == "human" else turn.role
    return f"- {speaker}: {_one_line(turn.value)}"


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
