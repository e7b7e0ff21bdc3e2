"""The model-backed summariser: asks an OpenAI-compatible chat endpoint (network I/O: not in rlctl/trajectories/)."""

from __future__ import annotations

from collections.abc import Sequence

import openai

from rlctl.judging.chat_retry import ChatGaveUp, ChatRefused, ask_with_retries
from rlctl.trajectories.records import Turn
from rlctl.trajectories.summarizers import SummarizationError, summary_prompt

DEFAULT_SUMMARY_MODEL = "google/gemini-3-flash-preview"
DEFAULT_SUMMARY_TEMPERATURE = 0.3


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
        messages = summary_prompt(turns, target_tokens)
        try:
            return ask_with_retries(
                lambda seconds_left: self._ask(messages, target_tokens, seconds_left),
                timeout_s=self._timeout_s,
                max_retries=self._max_retries,
                backoff_s=self._backoff_s,
                unusable=(SummarizationError,),
            )
        except ChatRefused as refusal:
            raise SummarizationError(f"summary model refused the request: {refusal.status}") from refusal
        except ChatGaveUp as failure:
            raise SummarizationError(
                f"no summary after {self._max_retries + 1} attempts or {self._timeout_s}s: {failure}"
            ) from None

    def _ask(self, messages: list[dict[str, str]], target_tokens: int, timeout: float) -> str:
        response = self._client.chat.completions.create(
            model=self._model,
            messages=messages,  # type: ignore[arg-type]  # plain role/content dicts; the SDK types them as TypedDicts
            temperature=self._temperature,
            # Headroom: reasoning models spend part of it thinking; the compressor trims the summary anyway.
            max_tokens=self._max_output_tokens or target_tokens * 4,
            timeout=timeout,
        )
        content = response.choices[0].message.content if response.choices else None
        if not content or not content.strip():
            raise SummarizationError("the summary model returned an empty answer")
        return content.strip()
