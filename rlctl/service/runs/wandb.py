"""W&B at run creation: is the key accepted, is the service reachable? (docs/RUNS.md#wb-mirror)

W&B only mirrors metrics that rlctl stores itself, so its answer never fails a run: a key W&B rejects, or a W&B
that cannot be reached, turns the run's W&B offline (files in the run directory, synced later by hand) and
leaves a warning on the run.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import httpx

from rlctl.service.settings import Settings

logger = logging.getLogger("rlctl.runs")

DEFAULT_WANDB_BASE_URL = "https://api.wandb.ai"
WANDB_INIT_TIMEOUT_S = 60
VIEWER_QUERY = "query Viewer { viewer { id username } }"


class WandbMode(StrEnum):
    ONLINE = "online"
    OFFLINE = "offline"
    DISABLED = "disabled"


class Probe(StrEnum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class ProbeResult:
    outcome: Probe
    detail: str


@dataclass(frozen=True)
class WandbPlan:
    """The run's W&B mode and, when it is offline because of W&B, the warning to record."""

    mode: WandbMode
    reason: str | None = None
    warning_code: str | None = None

    def record(self, run_dir: Path) -> dict[str, Any]:
        record: dict[str, Any] = {"mode": self.mode.value, "reason": self.reason}
        if self.mode == WandbMode.OFFLINE:
            offline_dir = run_dir / "wandb"
            record["offline_dir"] = str(offline_dir)
            record["sync_command"] = f"wandb sync {offline_dir}/offline-run-*"
        return record

    def warning(self, run_dir: Path) -> dict[str, Any] | None:
        if self.warning_code is None:
            return None
        record = self.record(run_dir)
        return {
            "code": self.warning_code,
            "parameter": None,
            "message": f"{self.reason}; the run logs to W&B offline in {record['offline_dir']} "
            f"(sync later with `{record['sync_command']}`); its metrics are complete in rlctl either way",
        }


def plan_wandb(key_set: bool, offline_requested: bool, probe: ProbeResult | None) -> WandbPlan:
    """Pure: the W&B mode of a new run from the server's configuration and the probe's answer."""
    if offline_requested:  # the operator's WANDB_MODE=offline wins over a key
        return WandbPlan(WandbMode.OFFLINE)
    if not key_set:
        return WandbPlan(WandbMode.DISABLED)
    if probe is None or probe.outcome == Probe.ACCEPTED:
        return WandbPlan(WandbMode.ONLINE)
    if probe.outcome == Probe.REJECTED:
        return WandbPlan(WandbMode.OFFLINE, f"W&B rejected WANDB_API_KEY ({probe.detail})", "wandb_key_rejected")
    return WandbPlan(WandbMode.OFFLINE, f"W&B could not be reached ({probe.detail})", "wandb_unreachable")


def probe_wandb(settings: Settings) -> ProbeResult | None:
    """Ask W&B who the key belongs to, within `wandb_check_timeout_s`; None when no key is set."""
    if settings.wandb_api_key is None:
        return None
    base_url = (settings.wandb_base_url or DEFAULT_WANDB_BASE_URL).rstrip("/")
    try:
        response = httpx.post(
            f"{base_url}/graphql",
            json={"query": VIEWER_QUERY},
            auth=("api", settings.wandb_api_key.get_secret_value()),
            timeout=settings.wandb_check_timeout_s,
        )
    except httpx.TimeoutException:
        return ProbeResult(Probe.UNREACHABLE, f"no answer from {base_url} within {settings.wandb_check_timeout_s:g} s")
    except httpx.HTTPError as error:
        return ProbeResult(Probe.UNREACHABLE, f"{base_url}: {type(error).__name__}")
    if response.status_code in (401, 403):
        return ProbeResult(Probe.REJECTED, f"HTTP {response.status_code}")
    if response.status_code >= 300:
        return ProbeResult(Probe.UNREACHABLE, f"{base_url} answered HTTP {response.status_code}")
    try:
        viewer = (response.json().get("data") or {}).get("viewer")
    except ValueError:
        return ProbeResult(Probe.UNREACHABLE, f"{base_url} answered something other than JSON")
    if not viewer:
        return ProbeResult(Probe.REJECTED, "the key belongs to no user")
    return ProbeResult(Probe.ACCEPTED, "ok")


def offline_requested() -> bool:
    """The operator ran the service with WANDB_MODE=offline: runs log offline, key or not."""
    return os.environ.get("WANDB_MODE") == "offline"


def run_wandb_mode(settings: Settings, record: dict[str, Any] | None) -> WandbMode:
    """The mode recorded when the run was created; a run recorded before modes were kept gets the server's."""
    if record and record.get("mode") in tuple(WandbMode):
        return WandbMode(record["mode"])
    return plan_wandb(settings.wandb_api_key is not None, offline_requested(), None).mode


def wandb_environment(settings: Settings, mode: WandbMode) -> dict[str, str]:
    """What the trainer and the environment get: the key only when the run logs online."""
    if mode == WandbMode.ONLINE and settings.wandb_api_key is not None:
        # wandb.init waits this long for W&B before it gives up (and the process falls back to offline).
        timeout = os.environ.get("WANDB_INIT_TIMEOUT", str(WANDB_INIT_TIMEOUT_S))
        return {"WANDB_API_KEY": settings.wandb_api_key.get_secret_value(), "WANDB_INIT_TIMEOUT": timeout}
    return {"WANDB_MODE": mode.value}
