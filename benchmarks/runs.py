"""Runs benchmark: start-up and stop latency of an offline run, and GET /runs throughput with 10,000 runs.

    .venv/bin/python benchmarks/runs.py [--postgres postgresql://postgres@127.0.0.1:5432/test] [--runs 10000]

Prints, on SQLite and (when given) PostgreSQL:
- seconds from POST /runs to `running` for an offline echo run on the local backend (the reference slept
  5 + 30 + 90 + 10 = 135 s before a run counted as running), and from POST /runs/{id}/stop to `stopped`;
- GET /runs (50 per page) and GET /healthz requests per second over the same client, and their ratio.
The service runs as a real `rlctl serve` subprocess on loopback.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import make_url

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from service.db import migrate  # noqa: E402
from service.db.engine import Database  # noqa: E402
from service.db.models import Run  # noqa: E402
from service.settings import normalize_database_url  # noqa: E402
from supervisor.ports import free_ports  # noqa: E402

REFERENCE_STARTUP_S = 135.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--postgres", default=os.environ.get("RLCTL_TEST_POSTGRES_URL"))
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlctl-bench-") as tmp:
        backends = [("sqlite", f"sqlite:///{Path(tmp) / 'sqlite' / 'rlctl.db'}")]
        if args.postgres:
            backends.append(("postgresql", None))
        for name, url in backends:
            with _database(name, url, args.postgres) as database_url:
                data_dir = Path(tmp) / name
                print(f"== {name}")
                with _service(database_url, data_dir) as base_url:
                    _lifecycle(base_url)
                    _seed(database_url, args.runs)
                    _throughput(base_url, args.runs, args.seconds)


def _lifecycle(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=300) as client:
        started = time.monotonic()
        run_id = client.post("/runs", json={"environment": "echo", "backend": "local"}).json()["id"]
        _wait(client, run_id, "running", 600)
        to_running = time.monotonic() - started
        stop_started = time.monotonic()
        client.post(f"/runs/{run_id}/stop")
        _wait(client, run_id, "stopped", 600)
        to_stopped = time.monotonic() - stop_started
    print(
        f"POST /runs -> running: {to_running:6.1f} s   (reference {REFERENCE_STARTUP_S:.0f} s: "
        f"{REFERENCE_STARTUP_S / to_running:.1f}x faster)"
    )
    print(f"stop -> stopped:       {to_stopped:6.1f} s")


def _wait(client: httpx.Client, run_id: str, status: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = client.get(f"/runs/{run_id}").json()
        if current["status"] == status:
            return
        if current["status"] in ("failed", "completed", "stopped"):
            raise RuntimeError(f"run ended {current['status']}: {current.get('failure')}")
        time.sleep(0.05)
    raise TimeoutError(f"run {run_id} did not reach {status}")


def _seed(database_url: str, count: int) -> None:
    db = Database(database_url)
    now = datetime.now(UTC)
    statuses = ("completed", "failed", "stopped")
    rows = [
        {
            "id": uuid.uuid4().hex[:12],
            "environment": "echo" if i % 3 else "gsm8k",
            "backend": "local",
            "status": statuses[i % 3],
            "config": {"tinker": {"total_steps": 60}},
            "ports": {},
            "stalled": False,
            "created_at": now - timedelta(seconds=i),
            "updated_at": now,
        }
        for i in range(count)
    ]
    with db.engine.begin() as connection:
        for start in range(0, count, 1000):
            connection.execute(insert(Run), rows[start : start + 1000])
    db.dispose()


def _throughput(base_url: str, runs: int, seconds: float) -> None:
    health = _requests_per_second(base_url, "/healthz", {}, seconds)
    listing = _requests_per_second(base_url, "/runs", {"limit": 50}, seconds)
    filtered = _requests_per_second(base_url, "/runs", {"limit": 50, "status": "failed"}, seconds)
    print(f"GET /healthz:                 {health:8.0f} req/s")
    print(f"GET /runs (of {runs}):        {listing:8.0f} req/s  ({listing / health:.2f} of /healthz)")
    print(f"GET /runs?status=failed:      {filtered:8.0f} req/s  ({filtered / health:.2f} of /healthz)")


def _requests_per_second(base_url: str, path: str, params: dict, seconds: float, workers: int = 4) -> float:
    deadline = time.monotonic() + seconds

    def worker(_: int) -> int:
        done = 0
        with httpx.Client(base_url=base_url, timeout=30) as client:
            while time.monotonic() < deadline:
                response = client.get(path, params=params)
                response.raise_for_status()
                done += 1
        return done

    started = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        total = sum(pool.map(worker, range(workers)))
    return total / (time.monotonic() - started)


@contextmanager
def _database(name: str, url: str | None, postgres: str | None):  # type: ignore[no-untyped-def]
    if name == "sqlite":
        Path(make_url(url).database).parent.mkdir(parents=True, exist_ok=True)
        yield url
        return
    admin = create_engine(normalize_database_url(postgres), isolation_level="AUTOCOMMIT")
    database = f"rlctl_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{database}"'))
    try:
        yield make_url(normalize_database_url(postgres)).set(database=database).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def _service(database_url: str, data_dir: Path):  # type: ignore[no-untyped-def]
    migrate.upgrade(Database(database_url))
    port = free_ports(1)[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLCTL_")}
    env.update(
        RLCTL_DATABASE_URL=database_url,
        RLCTL_DATA_DIR=str(data_dir),
        RLCTL_LOCAL_TOTAL_STEPS="100000",
        RLCTL_LOG_LEVEL="WARNING",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
        cwd=REPO_ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base_url}/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield base_url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


if __name__ == "__main__":
    main()
