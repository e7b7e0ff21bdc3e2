"""Summarisers for trajectory compression: a deterministic extractive one (no network) and one that asks an
OpenAI-compatible chat model."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import openai

from service.datasets.records import Turn
from service.datasets.stats import tool_result_failed
from service.datasets.tags import parse_tagged_tool_response, visible_text

DEFAULT_SUMMARY_MODEL = "google/gemini-3-flash-preview"
DEFAULT_SUMMARY_TEMPERATURE = 0.3
_NON_RETRYABLE_STATUS = frozenset({400, 401, 403, 404, 422})
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


class OpenAICompatibleSummarizer:
    """Asks a chat-completions endpoint for the summary, retrying transient failures with exponential backoff.

    ``timeout_s`` bounds the whole call for one record, retries included; when it runs out, or a non-transient
    error comes back, ``SummarizationError`` is raised and the compressor keeps the record as it was.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str = DEFAULT_SUMMARY_MODEL,
        temperature: float = DEFAULT_SUMMARY_TEMPERATURE,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        timeout_s: float = 120.0,
        max_output_tokens: int | None = None,
    ) -> None:
        self.name = f"openai-compatible:{model}"
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        self._model = model
        self._temperature = temperature
        self._max_retries = max_retries
        self._backoff_s = backoff_s
        self._timeout_s = timeout_s
        self._max_output_tokens = max_output_tokens

    def summarize(self, turns: Sequence[Turn], target_tokens: int) -> str:
        deadline = time.monotonic() + self._timeout_s
        messages = summary_prompt(turns, target_tokens)
        failure = "no attempt made"
        for attempt in range(self._max_retries + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                return self._ask(messages, target_tokens, remaining)
            except openai.APIStatusError as error:
                if error.status_code in _NON_RETRYABLE_STATUS:
                    raise SummarizationError(f"summary model refused the request: {error.status_code}") from error
                failure = f"HTTP {error.status_code}"
            except (openai.APIConnectionError, openai.APITimeoutError, SummarizationError) as error:
                failure = str(error) or type(error).__name__
            pause = min(self._backoff_s * 2**attempt, deadline - time.monotonic())
            if attempt < self._max_retries and pause > 0:
                time.sleep(pause)
        raise SummarizationError(f"no summary after {self._max_retries + 1} attempts or {self._timeout_s}s: {failure}")

    def _ask(self, messages: list[dict[str, str]], target_tokens: int, timeout: float) -> str:
        response = self._client.chat.completions.create(
            model=self._model,
            messages=messages,  # type: ignore[arg-type]
            temperature=self._temperature,
            # Headroom: reasoning models spend part of it thinking; the compressor trims the summary anyway.
            max_tokens=self._max_output_tokens or target_tokens * 4,
            timeout=timeout,
        )
        content = response.choices[0].message.content if response.choices else None
        if not content or not content.strip():
            raise SummarizationError("the summary model returned an empty answer")
        return content.strip()


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
