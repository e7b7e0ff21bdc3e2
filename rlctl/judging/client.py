"""The judge model: asks an OpenAI-compatible chat endpoint to score a group of trajectories, with a cache by
content whose store the caller gives (the service's database; an online run's environment keeps it in memory).

The key goes only to the judge's own endpoint (docs/TRAJECTORIES.md#judge); errors are scrubbed of every secret
before they are kept anywhere, and a failure leaves the group's records unscored: never a silent 0.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import openai

from rlctl.judging.chat_retry import ChatGaveUp, ChatRefused, ask_with_retries
from rlctl.trajectories.judge import (
    JudgeReplyError,
    JudgeVerdict,
    cache_key,
    content_hash,
    judge_messages,
    parse_judge_reply,
)
from rlctl.trajectories.records import TrajectoryRecord

MAX_JUDGE_OUTPUT_TOKENS = 4096
# An online run's judge key reaches its environment process in this variable only (rlctl/service/runs/launch.py puts it
# there, environments/dataset_online.py takes it out). Not the setting's own name (RLCTL_JUDGE_API_KEY): a Ray plan
# leaves out what the control plane's own environment holds (rlctl/service/runs/node.py), and must still carry it.
JUDGE_KEY_ENV = "RLCTL_RUN_JUDGE_KEY"


class JudgeFailed(Exception):
    """No usable verdicts for a group (after the retries): its records stay unscored."""


class JudgeClient:
    """One group per call, retried on transient failures and on unreadable answers, within ``timeout_s``."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        scrub: Callable[[str], str],
        max_retries: int = 2,
        timeout_s: float = 120.0,
        backoff_s: float = 1.0,
    ) -> None:
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        self.model, self._scrub = model, scrub
        self._max_retries, self._timeout_s, self._backoff_s = max_retries, timeout_s, backoff_s

    def judge(self, group: Sequence[TrajectoryRecord], rubric: str) -> list[JudgeVerdict]:
        messages = judge_messages(group, rubric)
        try:
            return ask_with_retries(
                lambda seconds_left: parse_judge_reply(self._ask(messages, seconds_left), len(group)),
                timeout_s=self._timeout_s,
                max_retries=self._max_retries,
                backoff_s=self._backoff_s,
                unusable=(JudgeReplyError,),
            )
        except ChatRefused as refusal:
            raise JudgeFailed(f"the judge refused the request: {refusal}") from None
        except ChatGaveUp as failure:
            raise JudgeFailed(
                self._scrub(f"no verdict after {self._max_retries + 1} attempts: {failure}")[:500]
            ) from None

    def _ask(self, messages: list[dict[str, str]], timeout: float) -> str:
        response = self._client.chat.completions.create(
            model=self.model,
            messages=messages,  # type: ignore[arg-type]  # plain role/content dicts; the SDK types them as TypedDicts
            max_tokens=MAX_JUDGE_OUTPUT_TOKENS,
            timeout=timeout,
        )
        content = response.choices[0].message.content if response.choices else None
        if not content:
            raise JudgeReplyError("the judge returned an empty answer")
        return content

    def close(self) -> None:
        self._client.close()


def secret_scrubber(secrets: Sequence[str]) -> Callable[[str], str]:
    """Replaces each secret in a text (for a process that has no service scrubber)."""
    kept = [secret for secret in secrets if secret]

    def scrub(text: str) -> str:
        for secret in kept:
            text = text.replace(secret, "***")
        return text

    return scrub


class VerdictCache(Protocol):
    """Where a judge's verdicts are kept by cache key (rlctl.trajectories.judge.cache_key)."""

    def get(self, key: str) -> list[JudgeVerdict] | None: ...

    def put(self, key: str, model: str, verdicts: list[JudgeVerdict]) -> None: ...


class MemoryVerdictCache:
    """The verdicts of the last `capacity` groups, in this process (an online run's environment has no database)."""

    def __init__(self, capacity: int = 4096) -> None:
        self._entries: OrderedDict[str, list[JudgeVerdict]] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def get(self, key: str) -> list[JudgeVerdict] | None:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def put(self, key: str, model: str, verdicts: list[JudgeVerdict]) -> None:
        with self._lock:
            self._entries[key] = verdicts
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)


@dataclass
class JudgeCounters:
    groups: int = 0
    calls: int = 0
    cache_hits: int = 0
    failed_groups: int = 0
    first_error: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "groups": self.groups,
            "judge_calls": self.calls,
            "cache_hits": self.cache_hits,
            "failed_groups": self.failed_groups,
            "first_error": self.first_error,
        }

    def run_metrics(self) -> dict[str, int]:
        """The running totals a run's environment logs (`judge/...`)."""
        return {
            "judge/groups": self.groups,
            "judge/calls": self.calls,
            "judge/cache_hits": self.cache_hits,
            "judge/failed_groups": self.failed_groups,
        }


class CachedJudge:
    """A judge whose verdicts are kept by content (model + rubric + the group's content hashes): a group seen
    before is answered from the cache without a request. Failures are counted, never cached. Thread-safe."""

    def __init__(self, client: JudgeClient, cache: VerdictCache) -> None:
        self.client, self._cache = client, cache
        self.counters = JudgeCounters()

    def judge(self, group: Sequence[TrajectoryRecord], rubric: str) -> list[JudgeVerdict] | None:
        """The verdicts, in group order; None when the judge failed (counted, with the first error kept)."""
        key = cache_key(self.client.model, rubric, [content_hash(record) for record in group])
        with self.counters.lock:
            self.counters.groups += 1
        cached = self._cache.get(key)
        if cached is not None and len(cached) == len(group):
            with self.counters.lock:
                self.counters.cache_hits += 1
            return cached
        with self.counters.lock:
            self.counters.calls += 1
        try:
            verdicts = self.client.judge(group, rubric)
        except JudgeFailed as error:
            with self.counters.lock:
                self.counters.failed_groups += 1
                self.counters.first_error = self.counters.first_error or str(error)
            return None
        self._cache.put(key, self.client.model, verdicts)
        return verdicts

    def close(self) -> None:
        self.client.close()


def judge_in_this_process(options: dict[str, Any]) -> CachedJudge:
    """The judge of a run's environment process (an online dataset run, a judged tool environment), from the options
    rlctl wrote in its config (`base_url`, `model`, `max_retries`, `timeout_s`) with a cache in memory. The key is
    taken out of the process's environment first, so code imported after it cannot read it there."""
    key = os.environ.pop(JUDGE_KEY_ENV, "") or "no-key"
    client = JudgeClient(
        options["base_url"],
        key,
        options["model"],
        secret_scrubber([key]),
        max_retries=int(options.get("max_retries", 2)),
        timeout_s=float(options.get("timeout_s", 120.0)),
    )
    return CachedJudge(client, MemoryVerdictCache())
