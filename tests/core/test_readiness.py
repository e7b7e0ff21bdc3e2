"""The background readiness check (`rlctl/service/health/readiness.py`): /readyz answers from its newest outcome,
which it refuses to trust once too old. Driven directly, on an event loop of the test's own, with a clock the test
sets."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from rlctl.service.errors import Unavailable
from rlctl.service.health.readiness import Readiness, ReadinessMonitor

READY = Readiness(status="ready", database="ok", schema_revision="head", head_revision="head")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_newest_outcome_is_the_answer_until_it_is_too_old() -> None:
    clock = Clock()
    outcomes: list[Readiness | Unavailable] = [READY, Unavailable("database schema is behind", {"at": 1})]

    async def check() -> Readiness:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Unavailable):
            raise outcome
        return outcome

    monitor = ReadinessMonitor(check, interval_s=1.0, max_age_s=5.0, clock=clock)
    with pytest.raises(Unavailable, match="not checked yet"):
        monitor.current()
    asyncio.run(monitor.refresh())
    assert monitor.current() == READY
    clock.now += 5.0
    assert monitor.current() == READY  # as old as may be trusted
    clock.now += 0.1
    with pytest.raises(Unavailable, match="overdue") as overdue:
        monitor.current()
    assert overdue.value.details == {"age_s": 5.1}

    asyncio.run(monitor.refresh())
    for _ in range(2):  # a new error each time, with the check's message and details
        with pytest.raises(Unavailable, match="schema is behind") as behind:
            monitor.current()
        assert behind.value.details == {"at": 1}


def test_a_check_that_fails_otherwise_is_not_ready_and_the_checks_go_on() -> None:
    outcomes: list[Exception | Readiness] = [RuntimeError("pool closed"), READY]

    async def check() -> Readiness:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monitor = ReadinessMonitor(check, interval_s=1.0, max_age_s=5.0)
    asyncio.run(monitor.refresh())
    with pytest.raises(Unavailable, match="readiness check failed") as failed:
        monitor.current()
    assert failed.value.details == {"reason": "RuntimeError"}
    asyncio.run(monitor.refresh())
    assert monitor.current() == READY


def test_a_check_that_hangs_is_not_ready_after_max_age() -> None:
    async def hangs() -> Readiness:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    monitor = ReadinessMonitor(hangs, interval_s=1.0, max_age_s=0.05)
    asyncio.run(monitor.refresh())
    with pytest.raises(Unavailable, match="timed out"):
        monitor.current()


def test_started_it_checks_every_interval_until_stopped() -> None:
    checks: list[int] = []

    async def check() -> Readiness:
        checks.append(1)
        return READY

    async def scenario() -> None:
        monitor = ReadinessMonitor(check, interval_s=0.001, max_age_s=5.0)
        await monitor.start()
        assert len(checks) == 1  # the first check is done before start returns: a service is checked when it serves
        while len(checks) < 4:  # bounded by the test's timeout; each pass yields to the monitor's task
            await asyncio.sleep(0.001)
        await monitor.stop()
        # no check after stop: the monitor's task (named for the service's task dumps) has ended
        assert not [task for task in asyncio.all_tasks() if task.get_name() == "rlctl-readiness"]

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))


def test_stop_returns_even_when_a_check_swallows_its_cancellation() -> None:
    """What asyncio.wait_for could do on Python 3.11 (a cancellation lost as the check ends): the service's shutdown
    waited on the monitor for ever. Here the check itself swallows the first cancellation it gets."""
    in_check = asyncio.Event()
    swallowed: list[bool] = []

    async def check() -> Readiness:
        in_check.set()
        try:
            await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed.append(True)  # the first one is lost: the check ends as if nothing had happened
        return READY

    async def scenario() -> None:
        monitor = ReadinessMonitor(check, interval_s=0.001, max_age_s=5.0)
        await monitor.start()
        in_check.clear()
        await in_check.wait()  # a check of the loop is under way
        stopping = asyncio.ensure_future(monitor.stop())
        done, _ = await asyncio.wait({stopping}, timeout=5)
        if not done:  # the loop outlived its cancellation: end it (the check raises a second one) and fail
            stopping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stopping
        assert done, "stop() still waiting on the monitor's task"

    asyncio.run(scenario())
    assert swallowed == [True]
