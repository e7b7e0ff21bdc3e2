"""Cost of a /metrics scrape: the state gauges are read from the database each time, so it grows with the tables.

    .venv/bin/python benchmarks/metrics_scrape.py [--runs 10000] [--jobs 5000] [--database-url URL] [--repeat 20]

Fills a fresh database (SQLite in a temporary directory by default; a PostgreSQL URL works, its tables must be
empty) with runs (three processes each, a status check each) and jobs, then times the whole exposition
(prometheus_client's generate_latest over the app's registry) and prints the median and the slowest scrape.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import insert

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlctl.service.db import migrate  # noqa: E402
from rlctl.service.db.engine import Database  # noqa: E402
from rlctl.service.db.models import Job, Run, RunProcess, StatusCheck  # noqa: E402
from rlctl.service.db.types import utcnow  # noqa: E402
from rlctl.service.monitoring.state import DatabaseStateCollector  # noqa: E402

RUN_STATES = ("running", "completed", "failed", "stopped")
JOB_STATES = ("succeeded", "failed", "running", "queued")


def fill(db: Database, runs: int, jobs: int) -> None:
    now = utcnow()
    run_ids = [uuid.uuid4().hex[:12] for _ in range(runs)]
    with db.session() as session:
        session.execute(
            insert(Run),
            [
                {"id": rid, "environment": "echo", "backend": "local", "status": RUN_STATES[i % 4], "config": {}}
                | {"ports": {}, "created_at": now, "updated_at": now, "stalled": False}
                for i, rid in enumerate(run_ids)
            ],
        )
        session.execute(
            insert(RunProcess),
            [
                {"run_id": rid, "role": role, "status": "running" if i % 4 == 0 else "exited"}
                for i, rid in enumerate(run_ids)
                for role in ("api", "trainer", "env")
            ],
        )
        session.execute(
            insert(StatusCheck),
            [
                {"run_id": rid, "checked_at": now, "snapshot": {}, "checks_allowed": 2, "checks_limited": 1}
                for rid in run_ids
            ],
        )
        session.execute(
            insert(Job),
            [
                {"id": uuid.uuid4().hex[:16], "kind": f"kind{i % 3}", "status": JOB_STATES[i % 4], "params": {}}
                | {"progress_done": 0, "created_at": now, "updated_at": now, "cancel_requested": False}
                for i in range(jobs)
            ],
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--database-url")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        db = Database(args.database_url or f"sqlite:///{Path(tmp) / 'bench.db'}")
        migrate.upgrade(db)
        started = time.perf_counter()
        fill(db, args.runs, args.jobs)
        filled_s = time.perf_counter() - started
        print(f"filled {args.runs} runs, {3 * args.runs} processes, {args.jobs} jobs in {filled_s:.1f} s")
        registry = CollectorRegistry()
        registry.register(DatabaseStateCollector(db))
        timings = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            body = generate_latest(registry)
            timings.append(time.perf_counter() - started)
        print(
            f"{db.engine.dialect.name}: scrape median {1000 * statistics.median(timings):.1f} ms, "
            f"max {1000 * max(timings):.1f} ms over {args.repeat} scrapes ({len(body)} bytes)"
        )
        db.dispose()


if __name__ == "__main__":
    main()
