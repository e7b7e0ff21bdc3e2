"""The compose path, proven on this machine's PostgreSQL (no Docker engine here).

The service runs the compose file's command with exactly the environment docker-compose.yml gives its container
(the image's ENV, then rlctl.env made from rlctl.env.example with a token filled in, then `environment:`), and
the Dockerfile's health check must pass against it. Substituted, because there is no container:

- database host and port `postgres:5432` (the compose service) → the test server's host and port;
- database name `rlctl` → a fresh database of the same user, per test (the test server is shared);
- RLCTL_DATA_DIR `/data` (the volume) → a temporary directory;
- PATH: the image's `/opt/venv/bin` → this interpreter's bin directory, `$PATH` → the python image's default;
- HOME and the working directory (`/app`) → temporary directories (a developer's .env must not leak in);
- the listening port 8080 (in the command) and the probe listener's 8081 (RLCTL_PROBE_PORT and the health
  check's URL) → free ports.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url

from rlctl.service.db import migrate
from rlctl.service.settings import normalize_database_url
from rlctl.supervisor.ports import free_ports
from tests.ops.deployfiles import (
    REPO_ROOT,
    container_environment,
    healthcheck_command,
    load_compose,
    read_dockerfile,
    read_env_file,
)
from tests.support.databases import POSTGRES_URL_VARIABLE
from tests.support.tiny_model import seed_tiny_model
from tests.support.waiting import REQUEST_TIMEOUT, wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not os.environ.get(POSTGRES_URL_VARIABLE), reason=f"needs PostgreSQL: set {POSTGRES_URL_VARIABLE} (CI does)"
    ),
]
PYTHON_IMAGE_PATH = "/usr/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
COMPOSE_PORT = 8080


@dataclass(frozen=True)
class ComposeDatabase:
    url: URL  # the compose file's URL with the substitutions applied


@pytest.fixture
def compose_database() -> Iterator[ComposeDatabase]:
    """A fresh database owned by the compose file's user (created on the test server when missing)."""
    compose_url = make_url(
        load_compose(REPO_ROOT / "docker-compose.yml")["services"]["rlctl"]["environment"]["RLCTL_DATABASE_URL"]
    )
    admin_url = make_url(normalize_database_url(os.environ[POSTGRES_URL_VARIABLE]))
    name = f"rlctl_compose_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    user, password = compose_url.username, compose_url.password
    with admin.connect() as connection:
        # Idempotent and race-free: concurrent test runs may both get here.
        connection.execute(
            text(
                f"DO $$ BEGIN CREATE ROLE {user} LOGIN PASSWORD '{password}'; "
                "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
            )
        )
        connection.execute(text(f'CREATE DATABASE "{name}" OWNER "{user}"'))
    try:
        yield ComposeDatabase(compose_url.set(host=admin_url.host, port=admin_url.port, database=name))
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def compose_environment(tmp_path: Path, database: ComposeDatabase, token: str) -> dict[str, str]:
    compose = load_compose(REPO_ROOT / "docker-compose.yml")
    service = compose["services"]["rlctl"]
    env_file = tmp_path / "rlctl.env"
    example = (REPO_ROOT / "rlctl.env.example").read_text()
    env_file.write_text(example.replace("RLCTL_API_TOKEN=\n", f"RLCTL_API_TOKEN={token}\n"))
    env = container_environment(read_dockerfile(REPO_ROOT / "Dockerfile").final.env(), service, read_env_file(env_file))
    assert make_url(env["RLCTL_DATABASE_URL"]).host == "postgres" and env["RLCTL_DATA_DIR"] == "/data"
    env["RLCTL_DATABASE_URL"] = database.url.render_as_string(hide_password=False)
    env["RLCTL_DATA_DIR"] = str(seed_tiny_model(tmp_path / "data"))  # the session's, not built again
    assert env["PATH"].startswith("/opt/venv/bin:")
    env["PATH"] = (
        env["PATH"].replace("/opt/venv/bin", str(Path(sys.executable).parent)).replace("$PATH", PYTHON_IMAGE_PATH)
    )
    env["HOME"] = str(tmp_path / "home")
    return env


def on_port(command: list[str], port: int, image_port: int = COMPOSE_PORT) -> list[str]:
    replaced = [part.replace(f"--port {image_port}", f"--port {port}") for part in command]
    replaced = [part.replace(f":{image_port}/", f":{port}/") for part in replaced]
    assert replaced != command, f"port {image_port} not found in {command}"
    return replaced


def test_the_service_runs_with_the_compose_environment(tmp_path: Path, compose_database: ComposeDatabase) -> None:
    token = secrets.token_urlsafe(24)
    env = compose_environment(tmp_path, compose_database, token)
    compose = load_compose(REPO_ROOT / "docker-compose.yml")
    port, probe_port = free_ports(2)
    command = on_port(compose["services"]["rlctl"]["command"], port)
    image_probe_port = int(env["RLCTL_PROBE_PORT"])  # the image's probe listener, which its health check asks
    env["RLCTL_PROBE_PORT"] = str(probe_port)
    health_check = read_dockerfile(REPO_ROOT / "Dockerfile").final.last("HEALTHCHECK")
    health = on_port(healthcheck_command(health_check), probe_port, image_probe_port)  # type: ignore[arg-type]
    workdir = tmp_path / "app"
    workdir.mkdir()
    (tmp_path / "home").mkdir()
    log_path = tmp_path / "service.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the service exited: {log_path.read_text()[-3000:]}")
            return subprocess.run(health, env=env, cwd=workdir, capture_output=True, timeout=30).returncode == 0

        wait_until(healthy, timeout=180, interval=0.5, message="the Dockerfile's health check")
        ready = httpx.get(f"{base}/readyz", timeout=REQUEST_TIMEOUT).json()
        assert ready["schema_revision"] == migrate.head_revision() == ready["head_revision"]

        assert httpx.get(f"{base}/environments", timeout=REQUEST_TIMEOUT).status_code == 401
        auth = {"Authorization": f"Bearer {token}"}
        missing = httpx.get(
            f"{base}/runs/nope", headers={**auth, "X-Request-ID": "compose-check-1"}, timeout=REQUEST_TIMEOUT
        )
        assert missing.status_code == 404 and missing.json()["error"]["request_id"] == "compose-check-1"
        assert "rlctl_database_up 1.0" in httpx.get(f"{base}/metrics", headers=auth, timeout=REQUEST_TIMEOUT).text

        # The client commands inside the container would find the token in the same environment.
        listed = subprocess.run(
            ["rlctl", "envs", "list", "--json"],
            env={**env, "RLCTL_URL": base},
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.returncode == 0, listed.stderr
        assert "echo" in [e["name"] for e in json.loads(listed.stdout)["environments"]]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    output = log_path.read_text()
    # uvicorn shuts down cleanly on SIGTERM, then ends by that signal
    assert process.returncode in (0, -signal.SIGTERM) and "Application shutdown complete" in output, output[-3000:]
    assert token not in output
    migrated, _, served = output.partition("database at revision")
    assert served, f"`rlctl db upgrade` did not run first: {output[-2000:]}"
    entries = [json.loads(line) for line in served.splitlines()[1:] if line.strip()]  # structured: JSON lines only
    access = [e for e in entries if e.get("logger") == "rlctl.access" and e.get("request_id") == "compose-check-1"]
    assert len(access) == 1
    assert access[0]["method"] == "GET" and access[0]["route"] == "/runs/{run_id}" and access[0]["status"] == 404
    assert isinstance(access[0]["duration_ms"], float)
