"""What a long pass over items reports to, and how it spreads the items over threads: shared by the jobs of
several domains (datasets, rewards, evaluations), and by requests that run such a pass while the caller waits."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Progress(Protocol):
    """What a long pass reports to: a job's handle, or nothing (`NO_PROGRESS`) when a request waits on it."""

    def progress(self, done: int, total: int | None = None, force: bool = False) -> None: ...

    def check_cancelled(self) -> None: ...


class _NoProgress:
    def progress(self, done: int, total: int | None = None, force: bool = False) -> None:
        """Nobody watches."""

    def check_cancelled(self) -> None:
        """Nothing cancels."""


NO_PROGRESS: Progress = _NoProgress()


def ordered_map(function: Callable[[T], R], items: Iterable[T], workers: int) -> Generator[R, None, None]:
    """`map` over a thread pool with at most 2 × workers items in flight, results in input order."""
    if workers <= 1:
        yield from map(function, items)
        return
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="job-pass")
    pending: deque[Future[R]] = deque()
    try:
        for item in items:
            pending.append(pool.submit(function, item))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
