"""Running `rlctl` client commands as real subprocesses against a live service."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.waiting import scaled

REPO_ROOT = Path(__file__).resolve().parents[2]
RLCTL = [sys.executable, "-m", "rlctl.service.cli"]


def client_env(base_url: str, token: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLCTL_")}
    env["RLCTL_URL"] = base_url
    if token:
        env["RLCTL_API_TOKEN"] = token
    return env


def rlctl(base_url: str, *args: str, token: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*RLCTL, *args],
        env=client_env(base_url, token),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(timeout),
    )


def spawn(base_url: str, *args: str, token: str | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [*RLCTL, *args],
        env=client_env(base_url, token),
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )


class LineCollector:
    """Reads a pipe in a thread, keeping each line (and calling `on_line` as it arrives)."""

    def __init__(self, pipe, on_line: Callable[[str], None] | None = None) -> None:  # type: ignore[no-untyped-def]
        self.lines: list[tuple[float, str]] = []
        self._on_line = on_line
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe) -> None:  # type: ignore[no-untyped-def]
        for line in pipe:
            self.lines.append((time.monotonic(), line))
            if self._on_line is not None:
                self._on_line(line)

    def text(self) -> str:
        return "".join(line for _, line in self.lines)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=scaled(30))
