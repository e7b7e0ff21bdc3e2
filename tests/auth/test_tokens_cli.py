"""`rlctl tokens create|list|revoke` as real subprocesses, against a running service that sees each change."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from rlctl.service.settings import Settings
from tests.support.live import live_service

RLCTL = [sys.executable, "-m", "rlctl.service.cli"]
REPO_ROOT = Path(__file__).resolve().parents[2]


def rlctl(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLCTL_")}
    env["RLCTL_DATA_DIR"] = str(settings.data_path)
    return subprocess.run([*RLCTL, "tokens", *args], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


def test_tokens_are_printed_once_stored_hashed_and_revoked_without_a_restart(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    with live_service(settings) as live:
        with live.client() as open_client:
            assert open_client.get("/runs").status_code == 200  # no token anywhere: open (loopback)
        created = rlctl(settings, "create", "--name", "dashboard", "--scope", "read")
        assert created.returncode == 0, created.stderr
        token = created.stdout.strip()
        assert token.startswith("rlctl_") and len(token) > 40
        stored = settings.tokens_path.read_text()
        assert token not in stored and hashlib.sha256(token.encode()).hexdigest() in stored
        listed = rlctl(settings, "list")
        assert listed.stdout.split() == ["dashboard", "read", listed.stdout.split()[2]] and token not in listed.stdout
        with live.client(token=token) as reader:
            assert reader.get("/runs").status_code == 200
            refused = reader.post("/runs", json={"environment": "echo"})
            assert refused.status_code == 403 and refused.json()["error"]["details"]["required_scope"] == "operate"
            with live.client() as anonymous:
                assert anonymous.get("/runs").status_code == 401  # a token exists now: every call needs one
            assert rlctl(settings, "revoke", "dashboard").returncode == 0
            assert reader.get("/runs").status_code == 401
            with live.client() as anonymous:
                assert anonymous.get("/runs").status_code == 401  # the last token revoked: closed, never open
    bad = rlctl(settings, "create", "--name", "x", "--scope", "root")
    assert bad.returncode == 2 and "unknown scope 'root'" in bad.stderr
    assert rlctl(settings, "revoke", "nobody").returncode == 2
