"""Waiting on conditions with deadlines (never fixed sleeps)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float, interval: float = 0.05, message: str = "") -> T:
    """Poll `condition` until it returns something truthy; fail with `message` at the deadline."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = condition()
        except Exception as exc:  # noqa: BLE001 - conditions may fail until they hold
            last_error = exc
        else:
            if result:
                return result
        time.sleep(interval)
    raise TimeoutError(f"condition not met within {timeout} s: {message} (last error: {last_error!r})")
