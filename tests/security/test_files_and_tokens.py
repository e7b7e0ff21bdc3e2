"""Files owner-only, a minimum token length, and a read token that cannot spend a run's live-check allowance.

Attacked before: the data directory, database and logs were world-readable; a 1-character RLCTL_API_TOKEN was
accepted; a read token's GET /runs/{id}/status spent the 30-minute allowance for everyone."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from rlctl.service.auth.scopes import Scope
from rlctl.service.auth.tokens import TokenStore
from rlctl.service.cli import MIN_API_TOKEN_CHARS
from rlctl.service.settings import Settings
from tests.runs.test_status_rate_limit import add_run, status_rows
from tests.support.live import live_service
from tests.support.service_process import REPO_ROOT, service_process
from tests.support.waiting import scaled

ADMIN_TOKEN = "files-and-tokens-admin-0123456789"


def test_serve_refuses_a_short_api_token(tmp_path: Path) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RLCTL_")}
    for token in ("x", "a" * (MIN_API_TOKEN_CHARS - 1)):
        done = subprocess.run(
            [sys.executable, "-m", "rlctl.service.cli", "serve", "--port", "9"],
            env={**environment, "RLCTL_API_TOKEN": token, "RLCTL_DATA_DIR": str(tmp_path / "var")},
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=scaled(120),
        )
        assert done.returncode == 2, done.stderr
        assert f"fewer than {MIN_API_TOKEN_CHARS}" in done.stderr and token not in done.stderr.split(":", 1)[0]
        assert not (tmp_path / "var").exists()  # refused before anything was created


def test_the_data_directory_and_every_file_in_it_are_owner_only(tmp_path: Path) -> None:
    data_dir = tmp_path / "var"
    data_dir.mkdir(mode=0o755)
    environment = {
        "RLCTL_DATA_DIR": str(data_dir),
        "RLCTL_DATABASE_URL": f"sqlite:///{data_dir / 'rlctl.db'}",
        "RLCTL_API_TOKEN": ADMIN_TOKEN,
        "RLCTL_WARM_UP": "false",
    }
    with service_process(environment, tmp_path / "service.log") as live, live.client() as client:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        record = b'{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}\n'
        assert client.post("/datasets", params={"name": "d"}, content=record, headers=headers).status_code == 201
        # The tiny model under models/ is copied in by this test's harness (ServiceProcess), not by the service.
        seeded = data_dir / "models"
        paths = [data_dir, *(p for p in data_dir.rglob("*") if p != seeded and seeded not in p.parents)]
        modes = {path: stat.S_IMODE(path.lstat().st_mode) for path in paths}
    assert modes[data_dir] == 0o700
    assert any(path.name == "rlctl.db" for path in modes) and len(modes) > 3
    readable = [f"{path} {mode:o}" for path, mode in modes.items() if mode & 0o077]
    assert not readable, readable


def test_a_read_token_sees_the_last_snapshot_and_spends_nothing(
    make_settings: Callable[..., Settings], database_url: str
) -> None:
    settings = make_settings(api_token=ADMIN_TOKEN)
    store = TokenStore(settings.tokens_path)
    reader, operator = store.create("reader", (Scope.READ,)), store.create("operator", (Scope.OPERATE,))
    with live_service(settings) as live:
        add_run(database_url, "run1")
        with live.client(token=reader) as read_only:
            before = read_only.get("/runs/run1/status")
            assert before.status_code == 429, before.text
            assert before.json()["last_snapshot"] is None and before.json()["stored"]["status"] == "running"
            assert "operate" in before.json()["error"]["message"]
            assert status_rows(database_url) == 0  # the allowance untouched
            tool = read_only.post("/tools/rl_check_status", json={"run_id": "run1"}).json()
            assert tool["rate_limited"] is True and tool["last_snapshot"] is None
        with live.client(token=operator) as operating:
            live_check = operating.get("/runs/run1/status")
            assert live_check.status_code == 200 and live_check.json()["live"] is True
        with live.client(token=reader) as read_only:
            for _ in range(3):
                cached = read_only.get("/runs/run1/status")
                assert cached.status_code == 200, cached.text
                assert cached.json()["live"] is False
                assert cached.json()["checked_at"] == live_check.json()["checked_at"]
            tool = read_only.post("/tools/rl_check_status", json={"run_id": "run1"}).json()
            assert tool["status"] == "running" and tool.get("rate_limited") is not True, tool
        with live.client(token=operator) as operating:
            assert operating.get("/runs/run1/status").status_code == 429  # one live check per interval, as before
