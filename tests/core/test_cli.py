"""The `rlctl` command: serve (and its loopback rule) and `db upgrade`, as real subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rlctl.service.db import migrate
from tests.support.live import free_port
from tests.support.tiny_model import seed_tiny_model
from tests.support.waiting import REQUEST_TIMEOUT, wait_until

pytestmark = pytest.mark.e2e

RLCTL = [sys.executable, "-m", "rlctl.service.cli"]
REPO_ROOT = Path(__file__).resolve().parents[2]


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLCTL_")}
    env.update({"RLCTL_DATA_DIR": str(seed_tiny_model(tmp_path / "var")), **extra})
    return env


def test_serve_refuses_a_public_bind_without_a_token(tmp_path: Path) -> None:
    result = subprocess.run(
        [*RLCTL, "serve", "--host", "0.0.0.0", "--port", str(free_port())],
        env=cli_env(tmp_path),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "RLCTL_API_TOKEN" in result.stderr


def test_db_upgrade_then_serve_with_a_token(tmp_path: Path) -> None:
    env = cli_env(tmp_path, RLCTL_API_TOKEN="cli-secret-token")
    upgraded = subprocess.run(
        [*RLCTL, "db", "upgrade"], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert upgraded.returncode == 0, upgraded.stderr
    assert f"revision {migrate.head_revision()}" in upgraded.stdout
    assert (tmp_path / "var" / "rlctl.db").exists()

    port = free_port()
    server = subprocess.Popen(
        [*RLCTL, "serve", "--host", "0.0.0.0", "--port", str(port)],
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(
            lambda: httpx.get(f"{base}/readyz", timeout=REQUEST_TIMEOUT).status_code == 200,
            timeout=60,
            message="readyz",
        )
        assert httpx.get(f"{base}/environments", timeout=REQUEST_TIMEOUT).status_code == 401
        listed = httpx.get(
            f"{base}/environments", headers={"Authorization": "Bearer cli-secret-token"}, timeout=REQUEST_TIMEOUT
        )
        assert listed.status_code == 200
        assert "gsm8k" in [e["name"] for e in listed.json()["environments"]]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        output, _ = server.communicate(timeout=30)
    assert b"cli-secret-token" not in output
