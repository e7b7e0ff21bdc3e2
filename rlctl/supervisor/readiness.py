"""Readiness probes: start the next process as soon as the previous one answers, not after a fixed sleep."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from rlctl.supervisor.process import ExitStatus, SupervisedProcess

PROBE_TIMEOUT_S = 2.0


class StartupCancelled(Exception):
    """A stop was requested while the run was starting."""


class ReadinessTimeout(Exception):
    def __init__(self, role: str, timeout_s: float) -> None:
        super().__init__(f"{role} was not ready within {timeout_s:g} s")
        self.role = role
        self.timeout_s = timeout_s


class ExitedDuringStartup(Exception):
    def __init__(self, role: str, status: ExitStatus) -> None:
        super().__init__(f"{role} {status.describe()} before it was ready")
        self.role = role
        self.status = status


@dataclass(frozen=True)
class HttpAnswers:
    """Ready when the URL answers 2xx. Plain data, so a plan can travel to another node (rlctl/supervisor/node.py)."""

    url: str
    kind: ClassVar[str] = "http"

    def __call__(self) -> bool:
        try:
            with urllib.request.urlopen(self.url, timeout=PROBE_TIMEOUT_S) as response:  # noqa: S310 - loopback only
                status: int = response.status
                return 200 <= status < 300
        except (urllib.error.URLError, OSError, ValueError):
            return False


@dataclass(frozen=True)
class AtroposEnvRegistered:
    """Ready when `envs` environments have registered with the run's Atropos API (they then produce rollouts):
    the API numbers them from 0 as they register, so the last one's status answers."""

    url: str  # the Atropos API's base URL
    envs: int = 1
    kind: ClassVar[str] = "atropos"

    def __call__(self) -> bool:
        request = urllib.request.Request(
            f"{self.url}/status-env",
            data=json.dumps({"env_id": self.envs - 1}).encode(),
            headers={"Content-Type": "application/json"},
            method="GET",
        )
        try:
            with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as response:  # noqa: S310
                body = json.loads(response.read() or b"{}")
        except (urllib.error.URLError, OSError, ValueError):
            return False
        return isinstance(body, dict) and "env_weight" in body


def http_answers(url: str) -> HttpAnswers:
    return HttpAnswers(url)


def atropos_env_registered(api_url: str, envs: int = 1) -> AtroposEnvRegistered:
    return AtroposEnvRegistered(api_url, envs)


READINESS_PROBE_INTERVAL_S = 0.2


def is_ready(process: SupervisedProcess, probe: Callable[[], bool] | None, deadline: float, timeout_s: float) -> bool:
    """One look at a starting process: True once its probe answers; ExitedDuringStartup when it has exited,
    ReadinessTimeout once `deadline` (monotonic) has passed."""
    status = process.poll()
    if status is not None:
        raise ExitedDuringStartup(process.role, status)
    if probe is None or probe():
        return True
    if time.monotonic() >= deadline:
        raise ReadinessTimeout(process.role, timeout_s)
    return False
