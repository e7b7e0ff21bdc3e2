"""Runs benchmark: start-up and stop latency of an offline run, and read throughput with 10,000 runs.

    .venv/bin/python benchmarks/runs.py [--postgres postgresql://postgres@127.0.0.1:5432/test] [--runs 10000]
        [--reads-only] [--connections 200] [--seconds 5] [--training] [--servers]

Prints, on SQLite and (when given, or RLCTL_TEST_POSTGRES_URL is set) PostgreSQL:
- seconds from POST /runs to `running` for an offline echo run on the local backend (the reference slept
  5 + 30 + 90 + 10 = 135 s before a run counted as running), and from POST /runs/{id}/stop to `stopped`
  (left out with --reads-only);
- with 10,000 runs stored: GET /runs (first page of 50), a filtered page (status, then environment), then
  GET /runs/{id} and GET /runs?limit=20, each beside GET /healthz measured the same way in the same run:
  requests per second, p50 and p99 latency, errors, and the ratios, each line with whether it meets issue 18's
  goal: every read >= 0.5 of /healthz's requests per second; the concurrent ones also p99 <= 2x /healthz's and
  no error. The first three use 4 connections; the last two `--connections` (200) at once. With --training, one
  offline run trains while the reads run (and GET /runs/{id} reads that run's record).
- probes beside reads (issue 40, "liveness never starves"): /healthz and /readyz paced at 200 a second (as an
  orchestrator probes, not as fast as answers come), alone and then beside `--connections` connections of reads
  (GET /runs/{id}, ?limit=20 and a filtered page of 50, in turn), three rounds of each in turn: their pooled p99
  beside the reads as a multiple of their pooled idle p99 (goal <= 2x), on the API's port and then on the probe
  listener's (`RLCTL_PROBE_PORT`: a process of its own); then the listener under a flood of probes (4
  connections, closed loop) beside the reads, for its capacity.
With --servers, the reads under `--connections` and the probes beside them are measured for three ways of serving
the same app, one after the other on the same database: uvloop with uvicorn's httptools protocol (the service
before issue 40), asyncio's loop with that protocol, and asyncio's loop with `ProbesFirstProtocol` (the service's
`rlctl.service.http.server_config`).
Every load run lasts `--seconds` (at most 20 s: the machine may be shared). The service is a real `rlctl serve`
subprocess on loopback; the load comes from benchmarks/load.py (wrk when installed, keep-alive connections).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import httpx
from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import make_url

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.load import LoadResult, has_wrk, run_beside, run_load, run_paced  # noqa: E402
from rlctl.service.db import migrate  # noqa: E402
from rlctl.service.db.engine import Database  # noqa: E402
from rlctl.service.db.models import Run  # noqa: E402
from rlctl.service.settings import normalize_database_url  # noqa: E402
from rlctl.supervisor.ports import free_ports  # noqa: E402

REFERENCE_STARTUP_S = 135.0
GOAL_THROUGHPUT = 0.5  # issue 18: each read >= 0.5 of /healthz's requests per second under the same load
GOAL_TAIL = 2.0  # and, under the concurrent load, p99 <= 2x /healthz's, with no error
GOAL_PROBES = 2.0  # issue 40: probes beside any reads answer within 2x their idle p99
PROBES = ["/healthz", "/readyz"]
# Probes come paced, as an orchestrator's do (one every few seconds): 200 a second give 1,000 latencies a round.
PROBES_PER_S = 200
# Idle and beside the reads alternate, pooled: the training run's phases moved the idle p99 between 1 and 6 ms.
PROBE_ROUNDS = 3
FLOOD_CONNECTIONS = 4
# --servers: name -> server_config overrides (`rlctl serve` as it is, with these settings changed)
SERVERS = {
    "uvloop + httptools (before)": {"loop": "uvloop", "http": "httptools"},
    "asyncio + httptools": {"http": "httptools"},
    "asyncio + probes first (now)": {},
}
# `rlctl serve` with `server_config`'s settings overridden by the JSON of argv[1]; the rest of argv is the CLI's.
_SERVE_WITH = """
import json, sys
from rlctl.service import cli, http
overrides, original = json.loads(sys.argv[1]), http.server_config
http.server_config = lambda app, host, port, **given: original(app, host, port, **(overrides | given))
sys.exit(cli.main(sys.argv[2:]))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--postgres", default=os.environ.get("RLCTL_TEST_POSTGRES_URL"))
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each load run (at most 20)")
    parser.add_argument("--connections", type=int, default=200, help="connections of the concurrent reads")
    parser.add_argument("--reads-only", action="store_true", help="skip the start-up and stop timings")
    parser.add_argument("--training", action="store_true", help="keep one offline run training during the reads")
    parser.add_argument("--servers", action="store_true", help="compare ways of serving (loop, protocol)")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; load from {'wrk' if has_wrk() else 'Python processes'}")
    with tempfile.TemporaryDirectory(prefix="rlctl-bench-") as tmp:
        backends = [("sqlite", f"sqlite:///{Path(tmp) / 'sqlite' / 'rlctl.db'}")]
        if args.postgres:
            backends.append(("postgresql", None))
        for name, url in backends:
            with _database(name, url, args.postgres) as database_url:
                data_dir = Path(tmp) / name
                print(f"== {name}")
                if args.servers:
                    _compare_servers(database_url, data_dir, args)
                    continue
                with _service(database_url, data_dir) as base_url:
                    if not args.reads_only:
                        _lifecycle(base_url)
                    _seed(database_url, args.runs)
                    with _training(base_url, args.training):
                        _reads(base_url, args.runs, args.seconds, args.connections)
                        _probes(base_url, args.seconds, args.connections)


def _compare_servers(database_url: str, data_dir: Path, args: argparse.Namespace) -> None:
    seeded = False
    for label, overrides in SERVERS.items():
        with _service(database_url, data_dir, overrides) as base_url:
            if not seeded:
                _seed(database_url, args.runs)
                seeded = True
            print(f"-- {label} (load average {os.getloadavg()[0]:.2f})")
            with _training(base_url, args.training):
                run_id = _a_run_id(base_url)
                health = run_load(base_url, ["/healthz"], args.connections, args.seconds)
                read = run_load(base_url, [f"/runs/{run_id}"], args.connections, args.seconds)
                _report("GET /runs/{id}", args.connections, health, read, concurrent=True)
                _probes(base_url, args.seconds, args.connections)


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


@contextmanager
def _training(base_url: str, enabled: bool):  # type: ignore[no-untyped-def]
    """One offline run training for the duration of the block (when enabled), stopped afterwards."""
    if not enabled:
        yield
        return
    with httpx.Client(base_url=base_url, timeout=300) as client:
        run_id = client.post("/runs", json={"environment": "echo", "backend": "local"}).json()["id"]
        _wait(client, run_id, "running", 600)
        try:
            yield
        finally:
            client.post(f"/runs/{run_id}/stop", params={"wait_s": 60})


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
    config = _stored_config()
    statuses = ("completed", "failed", "stopped")
    rows = [
        {
            "id": uuid.uuid4().hex[:12],
            "environment": "echo" if i % 3 else "gsm8k",
            "backend": "local",
            "status": statuses[i % 3],
            "config": config,
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
    if db.engine.dialect.name == "postgresql":  # the statistics autovacuum gathers after such a change
        with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text("ANALYZE runs"))
    db.dispose()


def _stored_config() -> dict:
    """A merged run config of the size and shape the service stores (about 3 KB of JSON): env, tinker, openai."""
    env = {f"env_field_{i}": f"value {i} " * 3 for i in range(40)}
    tinker = {f"tinker_field_{i}": i * 0.5 for i in range(20)} | {"total_steps": 60, "wandb_project": "bench"}
    openai = [{"model_name": "tiny", "base_url": "http://127.0.0.1:9000/v1", "api_key": "x", "timeout": 600}]
    return {"env": env, "tinker": tinker, "openai": openai}


def _a_run_id(base_url: str) -> str:
    return str(httpx.get(f"{base_url}/runs", params={"limit": 1}).json()["runs"][0]["id"])


def _probes(base_url: str, seconds: float, connections: int) -> None:
    """/healthz and /readyz paced at PROBES_PER_S, alone and then beside `connections` connections of reads (GET
    /runs/{id}, GET /runs?limit=20 and a filtered page, in turn), PROBE_ROUNDS rounds of each in turn, pooled: on
    the API's port, then on the probe listener's (`RLCTL_PROBE_PORT`, docs/ARCHITECTURE.md#probes). Then the
    listener under a flood of probes beside the same reads, for its capacity and what a flood costs the reads: no
    goal there (a closed loop of a few connections keeps the listener saturated, idle or not, and the ratio of
    its p99s moved between 1.2x and 6x from run to run)."""
    reads = [f"/runs/{_a_run_id(base_url)}", "/runs?limit=20", "/runs?limit=50&status=failed"]  # a mix, in turn
    for where, probe_url in (("API port", base_url), ("probe listener", _probe_url(base_url))):
        idle_rounds: list[LoadResult] = []
        busy_rounds: list[LoadResult] = []
        read_rounds: list[LoadResult] = []
        for _ in range(PROBE_ROUNDS):
            idle_rounds.append(run_paced(probe_url, PROBES, PROBES_PER_S, seconds))
            busy, beside = run_beside(
                base_url, reads, connections, seconds, partial(run_paced, probe_url, PROBES, PROBES_PER_S, seconds)
            )
            busy_rounds.append(busy)
            read_rounds.append(beside)
        paced = f"paced, {PROBES_PER_S}/s, {PROBE_ROUNDS} rounds"
        idle, busy = LoadResult.pooled(idle_rounds, paced), LoadResult.pooled(busy_rounds, paced)
        # No probe answered during the run is starvation, not a good ratio.
        tail = busy.percentile_s(0.99) / idle.percentile_s(0.99) if busy.requests else float("inf")
        met = tail <= GOAL_PROBES and busy.errors == 0
        rounds = ", ".join(
            f"{b.percentile_s(0.99) / i.percentile_s(0.99):.2f}x" for i, b in zip(idle_rounds, busy_rounds, strict=True)
        )
        print(f"{f'probes ({where}), idle':<30}   1 conn  {idle.describe()}")
        print(f"{'probes beside reads':<30}   1 conn  {busy.describe()}")
        reads_beside = ", ".join(
            f"{part.requests_per_s:.0f} req/s p99 {part.percentile_s(0.99) * 1e3:.0f} ms" for part in read_rounds
        )
        print(f"{'  the reads beside them':<30} {connections:>3} conn  {reads_beside}")
        print(
            f"{'  ratio':<30}           probes' p99 {tail:.2f}x idle (rounds {rounds})   "
            f"goal (<= {GOAL_PROBES}x, 0 errors): {'met' if met else 'NOT met'}"
        )
    listener = _probe_url(base_url)
    flood_idle = run_load(listener, PROBES, FLOOD_CONNECTIONS, seconds)
    flood, beside = run_beside(
        base_url, reads, connections, seconds, partial(run_load, listener, PROBES, FLOOD_CONNECTIONS, seconds)
    )
    print(f"{'a flood of probes (listener)':<30} {FLOOD_CONNECTIONS:>3} conn  {flood_idle.describe()}")
    print(f"{'  beside reads':<30} {FLOOD_CONNECTIONS:>3} conn  {flood.describe()}")
    print(f"{'  the reads beside it':<30} {connections:>3} conn  {beside.describe()}")


_PROBE_PORTS: dict[str, int] = {}  # the probe listener's port of each service this benchmark started


def _probe_url(base_url: str) -> str:
    return f"http://127.0.0.1:{_PROBE_PORTS[base_url]}"


def _reads(base_url: str, runs: int, seconds: float, connections: int) -> None:
    """Each read beside /healthz under the same load, /healthz measured right before it (noise drifts)."""
    run_id = _a_run_id(base_url)
    cases = [
        (f"GET /runs (of {runs})", "/runs?limit=50", 4),
        ("GET /runs?status=failed", "/runs?limit=50&status=failed", 4),
        ("GET /runs?environment=gsm8k", "/runs?limit=50&environment=gsm8k", 4),
        ("GET /runs/{id}", f"/runs/{run_id}", connections),
        ("GET /runs?limit=20", "/runs?limit=20", connections),
    ]
    for index, (label, path, width) in enumerate(cases):
        health = run_load(base_url, ["/healthz"], width, seconds)
        read = run_load(base_url, [path], width, seconds)
        _report(label, width, health, read, concurrent=index >= 3)


def _report(label: str, connections: int, health: LoadResult, read: LoadResult, concurrent: bool) -> None:
    throughput = read.requests_per_s / health.requests_per_s if health.requests_per_s else float("nan")
    tail = read.percentile_s(0.99) / health.percentile_s(0.99)
    met = throughput >= GOAL_THROUGHPUT and (not concurrent or (tail <= GOAL_TAIL and read.errors == 0))
    goal = f">= {GOAL_THROUGHPUT} req/s" + (f", p99 <= {GOAL_TAIL}x, 0 errors" if concurrent else "")
    print(f"{label:<30} {connections:>3} conn  {read.describe()}")
    print(f"{'  GET /healthz, same load':<30} {connections:>3} conn  {health.describe()}")
    print(
        f"{'  ratio':<30}           {throughput:8.2f} of /healthz's req/s, p99 {tail:.2f}x /healthz's   "
        f"goal ({goal}): {'met' if met else 'NOT met'}"
    )


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
def _service(database_url: str, data_dir: Path, overrides: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    migrate.upgrade(Database(database_url))
    port, probe_port = free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLCTL_")}
    env.update(
        RLCTL_DATABASE_URL=database_url,
        RLCTL_DATA_DIR=str(data_dir),
        RLCTL_LOCAL_TOTAL_STEPS="100000",
        RLCTL_LOG_LEVEL="WARNING",
        RLCTL_PROBE_PORT=str(probe_port),
    )
    process = subprocess.Popen(
        [sys.executable, "-c", _SERVE_WITH, json.dumps(overrides or {}), "serve", "--port", str(port)],
        cwd=REPO_ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base_url = f"http://127.0.0.1:{port}"
    _PROBE_PORTS[base_url] = probe_port
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
