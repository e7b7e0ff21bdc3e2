"""Waiting on conditions with deadlines (never fixed sleeps), every deadline scaled by one factor.

A deadline says how long a healthy system may take on a loaded 2-core machine. A slower machine (an emulator, a
sanitizer build) sets RLCTL_TEST_TIME_SCALE (default 1) and every deadline of the suite grows with it; a test never
passes or fails by how fast the machine is, only by what it waits for.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

TIME_SCALE_VARIABLE = "RLCTL_TEST_TIME_SCALE"
PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


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
    # Where every thread of this process is at the deadline (the in-process service's included): what a timeout
    # seen once on a loaded CI machine needs to be explained. In full on file descriptor 2 (pytest captures it for
    # the failure's report), and in short in the message (the one line a run's summary keeps).
    faulthandler.dump_traceback(file=2, all_threads=True)
    raise TimeoutError(
        f"condition not met within {limit:g} s: {message} (last error: {last_error!r}); threads: {thread_summary()}"
    )


def thread_summary(limit: int = 3000) -> str:
    """Each other thread of this process that is in the project's code: its name and the project frames it is in,
    innermost first, on one line."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    where = []
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        frames = [f for f, _ in traceback.walk_stack(frame) if _in_project(f.f_code.co_filename)][:3]
        if frames:
            path = " < ".join(f"{Path(f.f_code.co_filename).name}:{f.f_lineno} {f.f_code.co_name}" for f in frames)
            where.append(f"[{names.get(ident, ident)}] {path}")
    return "; ".join(where)[:limit] or "none in the project's code"


def _in_project(filename: str) -> bool:
    return filename.startswith(PROJECT_ROOT) and "site-packages" not in filename
