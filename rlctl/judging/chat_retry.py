"""One call to an OpenAI-compatible chat endpoint with retries: shared by the summariser and the judge.

Transient failures (connection, time-out, a 5xx or 429, an answer the caller cannot use) are retried with
exponential backoff, all within one deadline; a refusal (400/401/403/404/422) is not retried, since asking again
gets the same answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import openai

NON_RETRYABLE_STATUS = frozenset({400, 401, 403, 404, 422})
T = TypeVar("T")


class ChatRefused(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class ChatGaveUp(Exception):
    """Every attempt failed, or the deadline passed; the message is the last failure."""


def ask_with_retries(
    ask: Callable[[float], T],
    *,
    timeout_s: float,
    max_retries: int,
    backoff_s: float,
    unusable: tuple[type[Exception], ...] = (),
) -> T:
    """`ask(seconds_left)` until it answers; `unusable` are the caller's own errors for an answer it cannot read."""
    deadline = time.monotonic() + timeout_s
    failure = "no attempt made"
    for attempt in range(max_retries + 1):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            return ask(remaining)
        except openai.APIStatusError as error:
            if error.status_code in NON_RETRYABLE_STATUS:
                raise ChatRefused(error.status_code) from error
            failure = f"HTTP {error.status_code}"
        except (openai.APIConnectionError, openai.APITimeoutError) as error:
            failure = str(error) or type(error).__name__
        except unusable as error:
            failure = f"unreadable answer: {error}"
        pause = min(backoff_s * 2**attempt, deadline - time.monotonic())
        if attempt < max_retries and pause > 0:
            time.sleep(pause)
    raise ChatGaveUp(failure)
