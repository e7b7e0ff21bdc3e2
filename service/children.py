"""Child processes of the service's own work (environment schema reads, the local backend's tiny model).

They run in sessions of their own with a time-out, like `subprocess.run`; the service's shutdown ends those still
running (SIGKILL to their session), so a stopped service leaves none of them behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path


class ChildRunner:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen[bytes]] = set()
        self._closed = False

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout_s: float
    ) -> subprocess.CompletedProcess[bytes]:
        """Run to its end and return its exit code and output; TimeoutExpired (the child killed) past
        `timeout_s`; ChildProcessError once the service is closing."""
        with self._lock:
            if self._closed:
                raise ChildProcessError("the service is stopping")
            process = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            self._running.add(process)
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(process)
            process.communicate()
            raise
        finally:
            with self._lock:
                self._running.discard(process)
        return subprocess.CompletedProcess(list(argv), process.returncode, stdout, stderr)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """End every child still running; later calls to run() are refused."""
        with self._lock:
            self._closed = True
            running = list(self._running)
        for process in running:
            _kill(process)


def _kill(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
