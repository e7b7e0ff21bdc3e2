"""Environments over the API: read the source, write a managed one only after validation, versions, rollback,
delete, the hash a run records, and the same operations as agent tools over REST and MCP."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rlctl.service.auth.scopes import Scope
from rlctl.service.auth.tokens import TokenStore
from rlctl.service.db.engine import Database
from rlctl.service.db.models import Run
from rlctl.service.settings import BUILTIN_ENVIRONMENTS_DIR
from tests.conftest import build_settings
from tests.support import mcp_raw
from tests.support.databases import MigratedDatabases, database_kinds, fresh_database
from tests.support.live import LiveService, live_service

ADMIN_TOKEN = "authoring-admin-token"
ECHO_SOURCE = (BUILTIN_ENVIRONMENTS_DIR / "echo.py").read_text()
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def variant(name: str = "echo_variant", reward: str = "1.0") -> str:
    """echo under another name, scored by the digit share alone (weight `reward`): another reward."""
    source = ECHO_SOURCE.replace('name = "echo"', f'name = "{name}"')
    old = "return score_reply(reply, target, self.config.reply_tokens, self.config.digit_weight)"
    assert old in source
    return source.replace(old, f"return score_reply(reply, target, self.config.reply_tokens, {reward})")


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def live(tmp_path: Path, session_databases: MigratedDatabases) -> Iterator[LiveService]:
    """One database, PostgreSQL where configured: the checks run in child processes (seconds each) and versions
    are files; the database keeps only the runs that `delete` asks about."""
    kind = database_kinds()[-1]
    with (
        fresh_database(kind, tmp_path, session_databases) as url,
        live_service(build_settings(tmp_path / "var", url, api_token=ADMIN_TOKEN)) as service,
    ):
        yield service


@pytest.fixture
def admin(live: LiveService) -> Iterator[httpx.Client]:
    with live.client(token=ADMIN_TOKEN) as client:
        yield client


def invalid(response: httpx.Response) -> dict:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "ENVIRONMENT_INVALID"
    return next(c for c in error["details"]["validation"]["checks"] if not c["ok"])


def assert_nothing_stored(live: LiveService, admin: httpx.Client, name: str) -> None:
    assert admin.get(f"/environments/{name}/source").status_code == 404
    assert not (live.settings.managed_environments_dir / f"{name}.py").exists()
    assert not (live.settings.environment_versions_dir / name).exists()


def test_the_source_of_a_shipped_environment_and_its_hash(admin: httpx.Client) -> None:
    response = admin.get("/environments/echo/source")
    body = response.json()
    assert body["source"] == ECHO_SOURCE and body["hash"] == sha256(ECHO_SOURCE)
    assert response.headers["ETag"] == f'"{sha256(ECHO_SOURCE)}"'
    assert body["managed"] is False and body["version"] is None
    assert admin.get("/environments/nosuch/source").json()["error"]["code"] == "ENVIRONMENT_NOT_FOUND"


def test_a_written_environment_is_discovered_described_and_versioned(live: LiveService, admin: httpx.Client) -> None:
    source = variant()
    created = admin.put("/environments/echo_variant", json={"source": source})
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["created"] is True and body["version"] == 1 and body["hash"] == sha256(source)
    assert body["validation"]["ok"] and body["validation"]["class_name"] == "EchoEnv"
    assert [c["check"] for c in body["validation"]["checks"]] == [
        "syntax",
        "environment_class",
        "name",
        "name_clash",
        "import",
    ]
    assert (live.settings.data_path / body["file_path"]).parent == live.settings.managed_environments_dir
    listed = {e["name"] for e in admin.get("/environments").json()["environments"]}
    assert {"echo", "echo_variant"} <= listed
    detail = admin.get("/environments/echo_variant").json()
    assert detail["config_class"] == "EchoConfig"
    read = admin.get("/environments/echo_variant/source").json()
    assert read["source"] == source and read["managed"] is True and read["version"] == 1


@pytest.mark.parametrize(
    ("source", "check", "expected"),
    [
        ("x = 1\ndef broken(:\n    pass\n", "syntax", "line 2"),
        ("x = 1\n", "environment_class", "no class derives from BaseEnv"),
        (
            ECHO_SOURCE.replace('name = "echo"', 'name = "broken"') + "\n\nclass Second(EchoEnv):\n    pass\n",
            "environment_class",
            "found 2",
        ),
        (ECHO_SOURCE.replace('name = "echo"', 'name = "other"'), "name", "'other'"),
        (
            ECHO_SOURCE.replace('name = "echo"', 'name = "broken"').replace(
                "\nimport ", "\nimport no_such_module\nimport ", 1
            ),
            "import",
            "no_such_module",
        ),
    ],
    ids=["syntax", "no-class", "two-classes", "name-mismatch", "import-error"],
)
def test_a_source_that_fails_a_check_stores_nothing_and_says_why(
    live: LiveService, admin: httpx.Client, source: str, check: str, expected: str
) -> None:
    failed = invalid(admin.put("/environments/broken", json={"source": source}))
    assert failed["check"] == check
    if check == "syntax":
        assert failed["line"] == 2
    elif check == "import":
        assert any(expected in line for line in failed["traceback"]), failed
        assert "ModuleNotFoundError" in failed["traceback"][-1]
    else:
        assert expected in failed["message"], failed
    assert_nothing_stored(live, admin, "broken")


def test_a_shipped_name_cannot_be_taken_nor_a_shipped_environment_deleted(admin: httpx.Client) -> None:
    failed = invalid(admin.put("/environments/echo", json={"source": ECHO_SOURCE}))
    assert failed["check"] == "name_clash"
    assert admin.get("/environments/echo/source").json()["hash"] == sha256(ECHO_SOURCE)
    refused = admin.delete("/environments/echo")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "ENVIRONMENT_NOT_MANAGED"
    assert (BUILTIN_ENVIRONMENTS_DIR / "echo.py").exists()


def test_if_match_prevents_lost_updates_and_every_version_is_kept(live: LiveService, admin: httpx.Client) -> None:
    first, second, third = variant(reward="1.0"), variant(reward="0.9"), variant(reward="0.8")
    assert admin.put("/environments/echo_variant", json={"source": first}).status_code == 201
    stale = admin.put("/environments/echo_variant", json={"source": second}, headers={"If-Match": '"' + "0" * 64 + '"'})
    assert stale.status_code == 412 and stale.json()["error"]["code"] == "PRECONDITION_FAILED"
    assert stale.json()["error"]["details"]["current_hash"] == sha256(first)
    assert admin.get("/environments/echo_variant/source").json()["source"] == first
    replaced = admin.put("/environments/echo_variant", json={"source": second}, headers={"If-Match": sha256(first)})
    assert replaced.status_code == 200 and replaced.json()["version"] == 2 and replaced.json()["created"] is False
    # A write based on the first version, after the second: refused, nothing lost.
    late = admin.put("/environments/echo_variant", json={"source": third}, headers={"If-Match": f'"{sha256(first)}"'})
    assert late.status_code == 412
    versions = admin.get("/environments/echo_variant/versions").json()
    assert [(v["version"], v["hash"], v["current"]) for v in versions["versions"]] == [
        (1, sha256(first), False),
        (2, sha256(second), True),
    ]
    assert {v["created_by"] for v in versions["versions"]} == {"RLCTL_API_TOKEN"}
    rolled = admin.post("/environments/echo_variant/rollback", json={"version": 1})
    assert rolled.status_code == 200 and rolled.json()["version"] == 3 and rolled.json()["hash"] == sha256(first)
    assert admin.get("/environments/echo_variant/source").json()["source"] == first
    latest = admin.get("/environments/echo_variant/versions").json()["versions"][-1]
    assert latest["action"] == "rollback" and latest["from_version"] == 1 and latest["current"]
    missing = admin.post("/environments/echo_variant/rollback", json={"version": 99})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "ENVIRONMENT_VERSION_NOT_FOUND"


def test_delete_refuses_while_a_run_uses_it_then_removes_it(live: LiveService, admin: httpx.Client) -> None:
    assert admin.put("/environments/echo_variant", json={"source": variant()}).status_code == 201
    db = Database(live.settings.sqlalchemy_url)
    with db.session() as session:
        session.add(Run(id="usesvariant", environment="echo_variant", backend="local", status="running"))
    refused = admin.delete("/environments/echo_variant")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "ENVIRONMENT_IN_USE"
    assert refused.json()["error"]["details"]["run_ids"] == ["usesvariant"]
    with db.session() as session:
        session.get(Run, "usesvariant").status = "completed"
    db.dispose()
    deleted = admin.delete("/environments/echo_variant")
    assert deleted.status_code == 200 and deleted.json() == {"name": "echo_variant", "deleted_version": 1}
    assert admin.get("/environments/echo_variant").status_code == 404
    assert admin.get("/environments/echo_variant/versions").json()["count"] == 1  # kept, for a rollback
    restored = admin.post("/environments/echo_variant/rollback", json={"version": 1})
    assert restored.status_code == 200 and restored.json()["created"] is True


def test_only_admin_writes_environment_code(live: LiveService, admin: httpx.Client) -> None:
    store = TokenStore(live.settings.tokens_path)
    for scope in (Scope.READ, Scope.OPERATE):
        token = store.create(f"not-admin-{scope.value}", (scope,))
        with live.client(token=token) as client:
            assert client.get("/environments/echo/source").status_code == 200
            refused = client.put("/environments/echo_variant", json={"source": variant()})
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "INSUFFICIENT_SCOPE"
            assert refused.json()["error"]["details"]["required_scope"] == "admin"
    assert_nothing_stored(live, admin, "echo_variant")


def test_the_tools_read_and_write_with_the_validation_result_over_rest_and_mcp(admin: httpx.Client) -> None:
    read = admin.post("/tools/rl_read_environment", json={"name": "echo"}).json()
    assert read["source"] == ECHO_SOURCE and read["hash"] == sha256(ECHO_SOURCE)
    failed = admin.post("/tools/rl_write_environment", json={"name": "echo_variant", "source": "def f(:\n"}).json()
    assert failed["code"] == "ENVIRONMENT_INVALID" and failed["validation"]["checks"][0]["line"] == 1
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "rl_write_environment", "arguments": {"name": "echo_variant", "source": variant()}},
    }
    response = admin.post("/mcp", content=json.dumps(call), headers=mcp_raw.open_session(admin))
    written = response.json()["result"]["structuredContent"]
    assert written["version"] == 1 and written["validation"]["ok"], written
    stale = admin.post(
        "/tools/rl_write_environment",
        json={"name": "echo_variant", "source": variant(reward="0.5"), "if_match": sha256(ECHO_SOURCE)},
    ).json()
    assert stale["code"] == "PRECONDITION_FAILED" and stale["current_hash"] == sha256(variant())
