"""Fixtures for runs with real processes: the service, its runs, and the clean-up of everything they start."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TEST_DATA, build_settings
from tests.support.databases import database_kinds, fresh_database
from tests.support.live import LiveService, live_service
from tests.support.reaper import stop_run_processes
from tests.support.waiting import wait_until

TERMINAL = {"stopped", "completed", "failed"}
# Small, so an offline echo run finishes in well under a minute on 2 cores.
FAST_LOCAL = {"local_total_steps": 6, "local_save_checkpoint_interval": 3, "stop_grace_s": 5.0}


@pytest.fixture
def process_database_url(tmp_path: Path) -> Iterator[str]:
    """Runs with real processes are slow: they use PostgreSQL when it is configured (CI), else SQLite."""
    kind = database_kinds()[-1]
    with fresh_database(kind, tmp_path) as url:
        yield url
        stopped = stop_run_processes(url)
        assert not stopped, f"processes of runs were left running: {stopped}"


@pytest.fixture
def run_settings(tmp_path: Path, process_database_url: str) -> Callable[..., Any]:
    def make(data_dir: Path | None = None, **overrides: Any) -> Any:
        return build_settings(data_dir or tmp_path / "var", process_database_url, **{**FAST_LOCAL, **overrides})

    return make


@pytest.fixture
def run_service(run_settings: Callable[..., Any]) -> Iterator[LiveService]:
    with live_service(run_settings()) as live:
        yield live


def wait_for_status(client: httpx.Client, run_id: str, statuses: set[str], timeout: float) -> dict:
    """Wait for one of `statuses`; a run that ends in another state fails the test at once, with its reason."""

    def settled() -> dict | None:
        run = client.get(f"/runs/{run_id}").json()
        return run if run["status"] in statuses | TERMINAL else None

    run = wait_until(settled, timeout=timeout, interval=0.25, message=f"run {run_id} reaching {statuses}")
    assert run["status"] in statuses, f"run ended {run['status']}: {run.get('failure')}"
    return run


def service_environment(data_dir: Path, database_url: str, **extra: str) -> dict[str, str]:
    """The environment of an `rlctl serve` subprocess with the fast local settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLCTL_")}
    env.update(
        {
            "RLCTL_DATA_DIR": str(data_dir),
            "RLCTL_DATABASE_URL": database_url,
            "RLCTL_GSM8K_PATH": str(TEST_DATA / "gsm8k"),
            **{f"RLCTL_{k.upper()}": str(v) for k, v in FAST_LOCAL.items()},
            **extra,
        }
    )
    return env
