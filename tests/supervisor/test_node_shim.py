"""The node-side supervisor's pipe from the Ray job's entrypoint (docs/RAY.md, "Stopping, losing a node"): a byte
asks for a stop; the pipe's end without one means Ray lost the job; its end after one is the stop going on (Ray
SIGKILLs an entrypoint whose stop outlasts RAY_JOB_STOP_WAIT_TIME_S) and loses nothing.

Real pipes and a real thread, as in `python -m rlctl.supervisor.node`."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from rlctl.supervisor.node import _watch_shim


class Shim:
    """The entrypoint's end of the pipe, and what the watcher on the other end called."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()
        self.stops = 0
        self.losses = 0
        self.done = threading.Event()
        self.watcher = threading.Thread(
            target=_watch_shim, args=(self.read_end, self.stop, self.lost, self.done), daemon=True
        )

    def stop(self) -> None:
        self.stops += 1

    def lost(self) -> None:
        self.losses += 1

    def signal(self, times: int = 1) -> None:
        os.write(self.write_end, b"s" * times)

    def die(self) -> None:
        """The entrypoint's end closes (its process is gone); the watcher ends."""
        if self.write_end >= 0:
            os.close(self.write_end)
            self.write_end = -1
        self.watcher.join(timeout=30)
        assert not self.watcher.is_alive(), "the watcher did not end with the pipe"


@pytest.fixture
def shim() -> Iterator[Shim]:
    shim = Shim()
    shim.watcher.start()
    try:
        yield shim
    finally:
        shim.done.set()
        shim.die()
        os.close(shim.read_end)


def test_the_shim_dying_without_a_stop_is_a_lost_job(shim: Shim) -> None:
    shim.die()
    assert (shim.stops, shim.losses) == (0, 1)


def test_the_shim_killed_after_a_stop_loses_nothing(shim: Shim) -> None:
    shim.signal()
    shim.die()  # Ray's SIGKILL of the entrypoint, the stop still going on
    assert (shim.stops, shim.losses) == (1, 0)


def test_each_signal_to_the_shim_asks_again(shim: Shim) -> None:
    shim.signal(times=2)
    shim.die()
    assert (shim.stops, shim.losses) == (2, 0)
