"""A run names the token that created it and the hash of its environment's source."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from rlctl.service.auth.scopes import Scope
from rlctl.service.auth.tokens import TokenStore
from rlctl.service.settings import BUILTIN_ENVIRONMENTS_DIR
from tests.support.live import live_service


def test_a_run_records_its_token_and_environment_hash(run_settings: Callable[..., Any]) -> None:
    settings = run_settings()
    token = TokenStore(settings.tokens_path).create("ci-operator", (Scope.OPERATE,))
    with live_service(settings) as live, live.client(token=token) as client:
        created = client.post("/runs", json={"environment": "echo", "backend": "local"})
        assert created.status_code == 201, created.text
        run = client.get(f"/runs/{created.json()['id']}").json()
        assert run["created_by"] == "ci-operator"
        assert (
            run["environment_hash"] == hashlib.sha256((BUILTIN_ENVIRONMENTS_DIR / "echo.py").read_bytes()).hexdigest()
        )
        assert token not in str(run)
        stopped = client.post(f"/runs/{run['id']}/stop", params={"wait_s": 120}).json()
        assert stopped["status"] == "stopped"
