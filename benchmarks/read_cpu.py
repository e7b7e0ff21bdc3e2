"""CPU per request of the run reads, through the ASGI app in-process (no sockets, no load generator).

    .venv/bin/python benchmarks/read_cpu.py [--requests 300] [--profile PATH] [--training]
        [--postgres postgresql://postgres@127.0.0.1:5432/test]

Seeds 10,000 runs in a temporary SQLite database (with --postgres, a new database on that server, dropped
after), starts the app (its lifespan included), then sends each path `--requests` times, one after another, and
prints the process CPU time per request (every thread counted: the handlers run in the thread pool) beside GET
/healthz's, best of two rounds. With --training, an offline echo run trains meanwhile (as in
`benchmarks/runs.py --training`), and GET /runs/{id} reads its record (a new step, state and heartbeat every few
moments) beside a stored run's; the trainer's processes are not counted. On a shared machine this moves far less
than req/s under load (benchmarks/runs.py), so it is the figure to compare before and after a change.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import logging
import os
import pstats
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.runs import _database, _seed  # noqa: E402
from rlctl.service.db import migrate  # noqa: E402
from rlctl.service.db.engine import Database  # noqa: E402
from rlctl.service.states import RunStatus  # noqa: E402


async def _call(app: Any, path: str) -> None:
    route, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": route,
        "raw_path": route.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"bench")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "state": {},
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    if sent[0]["status"] != 200:
        raise RuntimeError(f"{path} answered {sent[0]['status']}")


@asynccontextmanager
async def _training_run(context: Any, enabled: bool) -> AsyncIterator[str | None]:
    """An offline echo run, running for the block (its processes are children of this process), then stopped:
    runs outlive the app's lifespan (they are adopted at the next start), not this benchmark."""
    if not enabled:
        yield None
        return
    from starlette.concurrency import run_in_threadpool

    from rlctl.service.runs import service as runs
    from rlctl.service.runs.manager import RunManager
    from rlctl.service.runs.schemas import CreateRunRequest

    manager = RunManager.of(context)
    request = CreateRunRequest(environment="echo", backend="local")
    run, _ = await run_in_threadpool(runs.create_run, context, manager, request)
    try:
        deadline = time.monotonic() + 600
        while runs.get_run(context, run.id).status != "running":
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run.id} did not start")
            await asyncio.sleep(0.2)
        yield run.id
    finally:
        await run_in_threadpool(runs.stop_run, context, manager, run.id, 60.0)


async def _measure(app: Any, requests: int, profile: Path | None = None, training: bool = False) -> None:
    async with app.router.lifespan_context(app), _training_run(app.state.context, training) as training_id:
        from rlctl.service.runs import service as runs

        run_id = runs.list_runs(app.state.context, limit=1, status=RunStatus.COMPLETED).runs[0].id
        paths = ["/healthz", "/runs?limit=50", "/runs?limit=50&status=failed", f"/runs/{run_id}", "/runs?limit=20"]
        labels = {f"/runs/{run_id}": "/runs/{id}"}
        if training_id is not None:
            paths.append(f"/runs/{training_id}")
            labels[f"/runs/{training_id}"] = "/runs/{id} (training)"
        for path in paths:  # warm caches (compiled statements, routes)
            for _ in range(30):
                await _call(app, path)
        best: dict[str, float] = {}
        for _round in range(2):
            for path in paths:
                started = time.process_time()
                for _ in range(requests):
                    await _call(app, path)
                cost = (time.process_time() - started) / requests
                best[path] = min(best.get(path, cost), cost)
        for path in paths:
            label = labels.get(path, path)
            ratio = best["/healthz"] / best[path]
            print(f"{label:<32} {best[path] * 1000:6.3f} ms CPU/request   /healthz's / this: {ratio:.2f}")
        if profile is not None:
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(requests):
                await _call(app, "/runs?limit=50")
            profiler.disable()
            profiler.dump_stats(str(profile))
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--profile", type=Path, help="write a cProfile of GET /runs?limit=50 here")
    parser.add_argument("--postgres", help="measure on PostgreSQL (a new database on this server), not SQLite")
    parser.add_argument("--training", action="store_true", help="read a training run's record too")
    args = parser.parse_args()
    engine = "postgresql" if args.postgres else "sqlite"
    with (
        tempfile.TemporaryDirectory(prefix="rlctl-bench-") as tmp,
        _database(engine, f"sqlite:///{Path(tmp) / 'rlctl.db'}", args.postgres) as url,
    ):
        migrate.upgrade(Database(url))
        _seed(url, 10_000)
        os.environ.update(RLCTL_DATABASE_URL=url, RLCTL_DATA_DIR=tmp, RLCTL_LOG_LEVEL="WARNING", RLCTL_WARM_UP="false")
        logging.disable(logging.INFO)  # the access log is not what is measured
        from rlctl.service.app import create_app

        asyncio.run(_measure(create_app(), args.requests, args.profile, args.training))


if __name__ == "__main__":
    main()
