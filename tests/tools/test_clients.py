"""Third-party MCP clients keep their selection between calls (docs/ARCHITECTURE.md#tool-sessions): the previous
major version of the `mcp` SDK and openai-agents with its default settings, each from the registry in a side
environment that `make test` builds (they cannot share rlctl's: tests/clients/plan.py says why), each a process
that reaches a live service over loopback HTTP. The newest `mcp` SDK is rlctl's own: tests/tools/test_tool_sessions.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlctl.service.settings import Settings
from tests.conftest import REPO_ROOT
from tests.support.live import LiveService, live_service
from tests.support.waiting import scaled

TOKEN = "clients-token"
PLAN = REPO_ROOT / "tests" / "clients" / "plan.py"


@pytest.fixture
def live(make_settings: Callable[..., Settings]) -> Iterator[LiveService]:
    with live_service(make_settings(api_token=TOKEN)) as service:
        yield service


def side_python(venv: str) -> Path:
    """The side environment's Python; where CI requires the clients (RLCTL_TEST_REQUIRE_CLIENTS=1) a missing one
    fails the test, elsewhere it skips (`make install-clients` builds them)."""
    python = REPO_ROOT / venv / "bin" / "python"
    if not python.exists():
        if os.environ.get("RLCTL_TEST_REQUIRE_CLIENTS") == "1":
            pytest.fail(f"{venv} is required here (RLCTL_TEST_REQUIRE_CLIENTS=1): run make install-clients")
        pytest.skip(f"no {venv} here: make install-clients builds it")
    return python


def run_plan(venv: str, client: str, base_url: str, home: Path | None = None) -> dict[str, Any]:
    """The plan in a client process; `home` is its HOME (hermes-agent keeps its state and logs under ~/.hermes)."""
    env = {**os.environ, "RLCTL_CLIENT_TOKEN": TOKEN, **({"HOME": str(home)} if home else {})}
    done = subprocess.run(
        [str(side_python(venv)), str(PLAN), client, base_url],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


def assert_the_selection_survived(outcome: dict[str, Any]) -> None:
    selected, edited, config = outcome["results"]
    assert [r["isError"] for r in outcome["results"]] == [False, False, False], outcome
    assert selected["environment"] == "echo" and edited["config"] == {"group_size": 4}
    assert config["environment"] == "echo", config  # the selection of the first call, seen by the third
    group_size = next(f for f in config["configurable_fields"] if f["name"] == "group_size")
    assert group_size["current_value"] == 4


def test_the_previous_major_mcp_sdk_keeps_the_selection(live: LiveService) -> None:
    outcome = run_plan(".venv-clients", "mcp1", live.base_url)
    assert outcome["client"] == "mcp 1.26.0" and outcome["protocol"] < "2026-07-28"  # the handshake era
    assert_the_selection_survived(outcome)


def test_hermes_agents_mcp_tool_client_keeps_the_selection(live: LiveService, tmp_path: Path) -> None:
    outcome = run_plan(".venv-clients", "hermes", live.base_url, home=tmp_path)
    assert outcome["client"] == "hermes-agent 0.19.0, mcp 1.26.0" and outcome["registered"] >= 20
    assert_the_selection_survived(outcome)


def test_openai_agents_with_default_settings_keeps_the_selection(live: LiveService) -> None:
    outcome = run_plan(".venv-agents", "agents", live.base_url)
    assert outcome["client"].startswith("openai-agents 0.24.0, mcp 2.")  # the newest protocol: no session id
    assert_the_selection_survived(outcome)
    # the same token over REST sees that selection: it was kept in the token's default session
    with live.client() as client:
        assert client.post("/tools/rl_get_current_config", json={}).json()["environment"] == "echo"
