"""Identical reads awaited on the event loop share one run, never one begun before they asked.

Many callers polling one run's record (agents, dashboards, `wrk` with 200 connections) each cost PostgreSQL a
round trip, and on a shared machine the round trips, not the CPU, bounded the reads: GET /runs/{id} answered 1,300
requests a second with a run training against 5,500 for /healthz (0.23; benchmarks/runs.py --reads-only
--training --postgres ...). Here callers of the same key that arrive while a run of it is under way wait for the
next run, which begins once that one ends, and share its answer. A run begins after each of its callers asked,
so whatever was committed before a caller asked is in its answer (a client sees its own writes); answers are
shared, so they are immutable (the routes' JSON bodies).

Part of the second read path of runs' two hottest reads, deleted with it (rlctl/service/db/plans.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class SharedReads:
    """At most one run of a key under way and one waiting to begin; its callers share its answer or its error."""

    def __init__(self) -> None:
        self._waiting: dict[Hashable, asyncio.Future[Any]] = {}
        self._under_way: dict[Hashable, asyncio.Task[Any]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()  # a task the loop only holds weakly must not be collected

    async def read(self, key: Hashable, run: Callable[[], Awaitable[T]]) -> T:
        answer = self._waiting.get(key)
        if answer is None:
            answer = asyncio.get_running_loop().create_future()
            answer.add_done_callback(_retrieve)
            self._waiting[key] = answer
            task = asyncio.create_task(self._run_next(key, answer, run))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # A caller that goes away (a closed connection) leaves the run to the others.
        result: T = await asyncio.shield(answer)
        return result

    async def _run_next(self, key: Hashable, answer: asyncio.Future[Any], run: Callable[[], Awaitable[Any]]) -> None:
        previous = self._under_way.get(key)
        if previous is not None:
            await asyncio.wait([previous])
        del self._waiting[key]  # from now on a caller waits for the run after this one
        self._under_way[key] = this = asyncio.current_task()  # type: ignore[assignment]
        try:
            answer.set_result(await run())
        except asyncio.CancelledError:
            answer.cancel()
            raise
        except Exception as error:  # noqa: BLE001 - every caller gets the run's error
            answer.set_exception(error)
        finally:
            if self._under_way.get(key) is this:
                del self._under_way[key]


def _retrieve(answer: asyncio.Future[Any]) -> None:
    """An error whose callers all went away is not an unhandled one."""
    if not answer.cancelled():
        answer.exception()
