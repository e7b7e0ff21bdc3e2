"""SharedReads' rules (rlctl/service/db/shared_reads.py): callers of a key share the run that begins after they
asked, never one under way; an error reaches each of them; a caller that goes away leaves the run to the rest."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from rlctl.service.db.shared_reads import SharedReads
from tests.support.waiting import REQUEST_TIMEOUT


class Reads:
    """Runs that each wait for their turn to end (`finish`), numbered in the order they begin."""

    def __init__(self) -> None:
        self.begun: list[int] = []
        self.ends: list[asyncio.Event] = []

    def run(self, error: Exception | None = None) -> Callable[[], Awaitable[int]]:
        async def read() -> int:
            number = len(self.begun) + 1
            self.begun.append(number)
            end = asyncio.Event()
            self.ends.append(end)
            await end.wait()
            if error is not None:
                raise error
            return number

        return read

    async def until_begun(self, count: int) -> None:
        async with asyncio.timeout(REQUEST_TIMEOUT):
            while len(self.begun) < count:
                await asyncio.sleep(0)

    def finish(self, number: int) -> None:
        self.ends[number - 1].set()


def test_callers_share_the_run_that_begins_after_they_asked() -> None:
    async def scenario() -> None:
        shared, reads = SharedReads(), Reads()
        first = asyncio.create_task(shared.read("k", reads.run()))
        await reads.until_begun(1)
        # Asked while run 1 is under way: it may have read before they asked, so they wait for run 2, together.
        later = [asyncio.create_task(shared.read("k", reads.run())) for _ in range(5)]
        other = asyncio.create_task(shared.read("other", reads.run()))  # another key runs at once
        await reads.until_begun(2)
        assert reads.begun == [1, 2]  # run 2 is the other key's: "k" waits for run 1 to end
        reads.finish(1)
        assert await first == 1
        await reads.until_begun(3)
        reads.finish(3)
        reads.finish(2)
        assert await asyncio.gather(*later) == [3] * 5
        assert await other == 2
        assert reads.begun == [1, 2, 3]

    asyncio.run(scenario())


def test_an_error_reaches_every_caller_and_the_next_run_begins_anew() -> None:
    async def scenario() -> None:
        shared, reads = SharedReads(), Reads()
        failing = [asyncio.create_task(shared.read("k", reads.run(LookupError("gone")))) for _ in range(3)]
        await reads.until_begun(1)
        reads.finish(1)
        for task in failing:
            with pytest.raises(LookupError, match="gone"):
                await task
        after = asyncio.create_task(shared.read("k", reads.run()))
        await reads.until_begun(2)
        reads.finish(2)
        assert await after == 2

    asyncio.run(scenario())


def test_a_caller_that_goes_away_leaves_the_run_to_the_others() -> None:
    async def scenario() -> None:
        shared, reads = SharedReads(), Reads()
        leaving = asyncio.create_task(shared.read("k", reads.run()))
        staying = asyncio.create_task(shared.read("k", reads.run()))
        await reads.until_begun(1)
        leaving.cancel()
        reads.finish(1)
        assert await staying == 1
        assert leaving.cancelled()

    asyncio.run(scenario())
