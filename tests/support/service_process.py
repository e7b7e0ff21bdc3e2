"""The service as a real `rlctl serve` subprocess, for tests that kill and restart it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.live import free_port
from tests.support.tiny_model import seed_tiny_model
from tests.support.waiting import scaled, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ServiceProcess:
    environment: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    popen: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        if "RLCTL_DATA_DIR" in self.environment:  # the session's tiny model, where its runs look for it
            seed_tiny_model(Path(self.environment["RLCTL_DATA_DIR"]))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> None:
        log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "rlctl.service.cli", "serve", "--port", str(self.port)],
            cwd=REPO_ROOT,
            env=self.environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        wait_until(self._ready, timeout=timeout, message=f"service ready (log {self.log_path})")

    def _ready(self) -> bool:
        if self.popen is not None and self.popen.poll() is not None:
            raise RuntimeError(f"service exited: {self.log_path.read_text()[-2000:]}")
        try:
            return httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        """SIGKILL the service alone (not its runs' processes, which live in their own groups)."""
        if self.popen is not None and self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=scaled(30))

    def terminate(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=scaled(60))
            except subprocess.TimeoutExpired:
                self.kill()

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=scaled(120), **kwargs)


@contextmanager
def service_process(environment: dict[str, str], log_path: Path) -> Iterator[ServiceProcess]:
    service = ServiceProcess({**os.environ, **environment}, log_path)
    service.start()
    try:
        yield service
    finally:
        service.terminate()
