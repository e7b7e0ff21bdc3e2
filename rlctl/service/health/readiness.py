"""The readiness check behind `/readyz`, run in the background so that a probe never waits on the database.

A probe that queried the database itself answered as slowly as the database did: on PostgreSQL, sharing the
machine's cores with 200 reading connections and a training run, the probes' p99 was 5× their idle p99
(`benchmarks/runs.py --reads-only --training`, docs/ARCHITECTURE.md#performance). The check now runs every
`READINESS_INTERVAL_S` on the event loop and `/readyz` answers from its newest result. A result older than
`READINESS_MAX_AGE_S` means the check itself is stuck (a database that does not answer): the service is then not
ready, whatever the last result said.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from rlctl.service.context import Component
from rlctl.service.errors import Unavailable

READINESS_INTERVAL_S = 0.5
READINESS_MAX_AGE_S = 5.0  # ten missed checks: the database (or the loop) does not answer


async def cancelled(task: asyncio.Task[None] | None) -> None:
    """`task` cancelled, and ended, when there is one."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class Readiness(BaseModel):
    status: str
    database: str
    schema_revision: str | None
    head_revision: str | None


@dataclass(frozen=True)
class _NotReady:
    message: str
    details: dict[str, Any]


class ReadinessMonitor(Component):
    """Runs `check` (a Readiness, or Unavailable raised) every `interval_s`; `current()` is its newest outcome."""

    def __init__(
        self,
        check: Callable[[], Awaitable[Readiness]],
        interval_s: float = READINESS_INTERVAL_S,
        max_age_s: float = READINESS_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._check = check
        self.interval_s = interval_s
        self.max_age_s = max_age_s
        self._clock = clock
        self._latest: tuple[float, Readiness | _NotReady] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    async def refresh(self) -> None:
        """Run the check once and keep its outcome."""
        outcome: Readiness | _NotReady
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation that arrives as the
            # check ends, and the service's shutdown then waited on this task for ever
            async with asyncio.timeout(self.max_age_s):
                outcome = await self._check()
        except Unavailable as exc:
            outcome = _NotReady(exc.message, dict(exc.details or {}))
        except TimeoutError:
            outcome = _NotReady("database check timed out", {"timeout_s": self.max_age_s})
        except Exception as exc:  # any other failure is an answer too: the checks must go on
            outcome = _NotReady("readiness check failed", {"reason": type(exc).__name__})
        self._latest = (self._clock(), outcome)

    async def start(self) -> None:
        """A first check now (a service is ready only once checked), then one every interval."""
        await self.refresh()
        self._task = asyncio.create_task(self._every_interval(), name="rlctl-readiness")

    async def stop(self) -> None:
        """No check after this returns; one under way is cancelled (and, were its cancellation lost, the loop still
        ends after it: `_stopping`)."""
        self._stopping = True
        await cancelled(self._task)
        self._task = None

    def current(self) -> Readiness:
        """The newest outcome; raises Unavailable when it was not ready, or is too old to trust."""
        if self._latest is None:
            raise Unavailable("readiness not checked yet", {})
        checked_at, outcome = self._latest
        age = self._clock() - checked_at
        if age > self.max_age_s:
            raise Unavailable("readiness check overdue", {"age_s": round(age, 1)})
        if isinstance(outcome, _NotReady):
            raise Unavailable(outcome.message, outcome.details)
        return outcome

    async def _every_interval(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.interval_s)
            if not self._stopping:
                await self.refresh()
