"""Fixtures of the dataset and collection API tests: the real public trajectories, job waiting, uploads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TEST_DATA
from tests.support.waiting import wait_until

TRAJECTORIES = TEST_DATA / "trajectories"


@pytest.fixture(scope="session")
def trajectories() -> Path:
    return TRAJECTORIES


def wait_job(client: httpx.Client, job: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    """The job once it has ended (any terminal state)."""

    def ended() -> dict[str, Any] | None:
        current = client.get(f"/jobs/{job['id']}").json()
        return current if current["status"] in ("succeeded", "failed", "cancelled") else None

    return wait_until(ended, timeout=timeout, message=f"job {job['id']} ({job['kind']}) ends")


def succeeded(client: httpx.Client, response: httpx.Response, timeout: float = 120) -> dict[str, Any]:
    """The result of the job a 202 response started, asserting it succeeded."""
    assert response.status_code == 202, response.text
    job = wait_job(client, response.json(), timeout)
    assert job["status"] == "succeeded", job
    return job["result"]


def upload(client: httpx.Client, path: Path, name: str = "upload", **params: Any) -> httpx.Response:
    return client.post("/datasets", params={"name": name, **params}, content=path.read_bytes())
