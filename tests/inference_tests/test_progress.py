"""An inference test's progress as its models' threads report it: written one at a time, so it never goes back."""

from __future__ import annotations

import threading
from typing import cast

from rlctl.service.inference_tests.jobs import ProgressTracker
from rlctl.service.jobs.runner import JobHandle
from tests.support.waiting import wait_until

# How long a write stays open for another model's write to come in. A tracker that let it in fails the test;
# a machine too slow to bring it in time only lets a broken tracker pass, never a sound one fail.
OVERLAP_WINDOW_S = 1.0


class OverlapRecordingHandle:
    """Stands for a job's handle: records what is written, and whether a write began while another was under way
    (a job's write is a database transaction: the later count can commit first)."""

    def __init__(self) -> None:
        self.written: list[int] = []
        self.inside = 0
        self.overlapped = False
        self._lock = threading.Lock()
        self._second_writer = threading.Event()

    def progress(self, done: int, total: int | None = None, force: bool = False) -> None:
        with self._lock:
            self.inside += 1
            if self.inside > 1:
                self.overlapped = True
                self._second_writer.set()
        self._second_writer.wait(OVERLAP_WINDOW_S)  # the later writer, if let in, finishes first
        with self._lock:
            self.written.append(done)
            self.inside -= 1


def test_two_models_progress_is_written_in_the_order_it_was_counted() -> None:
    handle = OverlapRecordingHandle()
    tracker = ProgressTracker(cast(JobHandle, handle), ["a", "b"], num_steps=1)
    first = threading.Thread(target=tracker.steps, args=("a", 1))
    first.start()
    wait_until(lambda: handle.inside == 1, timeout=30, message="the first model's write is under way")
    second = threading.Thread(target=tracker.ended, args=("b",))
    second.start()
    first.join(timeout=30)
    second.join(timeout=30)
    assert not first.is_alive() and not second.is_alive()
    assert not handle.overlapped, "one write at a time"
    assert handle.written == [1, 2], "the larger count, counted later, is the one that stays"
