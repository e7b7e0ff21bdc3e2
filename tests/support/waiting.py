"""Waiting on conditions with deadlines (never fixed sleeps), every deadline scaled by one factor.

A deadline says how long a healthy system may take on a loaded 2-core machine. A slower machine (an emulator, a
sanitizer build) sets RLCTL_TEST_TIME_SCALE (default 1) and every deadline of the suite grows with it; a test never
passes or fails by how fast the machine is, only by what it waits for.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

TIME_SCALE_VARIABLE = "RLCTL_TEST_TIME_SCALE"


def _time_scale() -> float:
    raw = os.environ.get(TIME_SCALE_VARIABLE, "1")
    try:
        scale = float(raw)
    except ValueError:
        raise RuntimeError(f"{TIME_SCALE_VARIABLE} must be a number, not {raw!r}") from None
    if scale <= 0:
        raise RuntimeError(f"{TIME_SCALE_VARIABLE} must be positive, not {raw!r}")
    return scale


TIME_SCALE = _time_scale()

# A request's deadline: what a loaded machine may take to answer one (httpx's default of 5 s is not one; a first
# /openapi.json or MCP tools/list there took longer). Every client of the suite has this one unless it needs another.
REQUEST_TIMEOUT = 120.0 * TIME_SCALE


def scaled(seconds: float) -> float:
    """A deadline of the suite: `seconds` on the reference machine, times RLCTL_TEST_TIME_SCALE."""
    return seconds * TIME_SCALE


def wait_until(condition: Callable[[], T], timeout: float, interval: float = 0.05, message: str = "") -> T:
    """Poll `condition` until it returns something truthy; fail with `message` at the (scaled) deadline."""
    limit = scaled(timeout)
    deadline = time.monotonic() + limit
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
    raise TimeoutError(f"condition not met within {limit:g} s: {message} (last error: {last_error!r})")
