"""Liveness and readiness probes stay answered while the service is busy (issue 40: a probe must not fail during a
read burst). The service is served as `rlctl serve` serves it (`rlctl.service.http.server_config`), on loopback."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import Connection, create_engine, text
from starlette.types import ASGIApp, Receive, Scope, Send

from rlctl.service.db.engine import LOOP_READ_CONNECTIONS, REQUEST_THREADS
from rlctl.service.health.readiness import READINESS_INTERVAL_S, READINESS_MAX_AGE_S
from rlctl.service.settings import Settings
from tests.support.live import LiveService, live_service
from tests.support.waiting import REQUEST_TIMEOUT, scaled, wait_until

HELD = REQUEST_THREADS + 4  # more blocking requests than worker threads: some wait for a thread


def test_probes_answer_while_every_worker_thread_is_held(make_settings: Callable[..., Settings]) -> None:
    release = threading.Event()
    holding: list[int] = []

    def prepare(app: FastAPI) -> None:
        @app.get("/test-hold")
        def hold() -> dict[str, str]:  # a blocking handler: it runs in a worker thread
            holding.append(1)
            release.wait(scaled(60))
            return {}

    with live_service(make_settings(), prepare) as live, ExitStack() as stack:
        stack.callback(release.set)  # the held requests end even when the test fails
        for _ in range(HELD):
            _send(stack.enter_context(_connection(live)), "/test-hold")
        wait_until(lambda: len(holding) == REQUEST_THREADS, timeout=60, message="every worker thread held")
        with live.anonymous() as client:
            assert client.get("/healthz").json() == {"status": "ok"}
            ready = client.get("/readyz")
            assert ready.status_code == 200 and ready.json()["status"] == "ready", ready.text
        assert len(holding) == REQUEST_THREADS  # the probes went by while reads still waited for a thread
        release.set()
        wait_until(lambda: len(holding) == HELD, timeout=60, message="the waiting reads served after the release")


def test_readiness_has_a_connection_of_its_own_while_every_read_connection_waits(
    make_settings: Callable[..., Settings], database_url: str
) -> None:
    """PostgreSQL: the runs table locked, more reads than the loop's read connections wait on it; /readyz still
    answers (its read would otherwise queue behind them, and give up with a 503)."""
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite's reads run in the service's process, on no pool")
    held = LOOP_READ_CONNECTIONS + 4
    with live_service(make_settings()) as live, ExitStack() as stack:
        locker = create_engine(database_url)
        stack.callback(locker.dispose)
        lock = stack.enter_context(locker.connect())
        lock.execute(text("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE"))  # until the rollback below
        stack.callback(lock.rollback)
        connections = [stack.enter_context(_connection(live)) for _ in range(held)]
        for index, connection in enumerate(connections):
            _send(connection, f"/runs/absent{index}")  # each a read of its own: identical reads would share one
        wait_until(lambda: _waiting_on_runs(lock) >= LOOP_READ_CONNECTIONS, timeout=60, message="reads blocked")
        blocked_at = time.monotonic()
        with live.anonymous() as client:

            def ready_after_the_newest_result_would_be_overdue() -> bool:
                # /readyz answers from the background check: ready this long after the reads blocked means the
                # check kept answering on its own connection (queued behind them, its result would be overdue)
                ready = client.get("/readyz")
                assert ready.status_code == 200, ready.text
                return time.monotonic() - blocked_at > READINESS_MAX_AGE_S + 2 * READINESS_INTERVAL_S

            wait_until(ready_after_the_newest_result_would_be_overdue, timeout=60, message="checks after the block")
        assert _waiting_on_runs(lock) == LOOP_READ_CONNECTIONS  # the reads still wait: the checks went by them
        lock.rollback()
        for connection in connections:
            assert _response(connection).startswith(b"HTTP/1.1 404")


def test_a_database_that_stops_answering_makes_the_service_unready_while_readyz_answers_at_once(
    make_settings: Callable[..., Settings], database_url: str
) -> None:
    """PostgreSQL: the migration table locked, the background check hangs; /readyz keeps answering at once, and says
    not ready once the newest result is too old to trust."""
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite's check runs in the service's process: a lock cannot make it hang without the loop")
    with live_service(make_settings()) as live, ExitStack() as stack, live.anonymous() as client:
        assert client.get("/readyz").status_code == 200
        locker = create_engine(database_url)
        stack.callback(locker.dispose)
        lock = stack.enter_context(locker.connect())
        lock.execute(text("LOCK TABLE alembic_version IN ACCESS EXCLUSIVE MODE"))
        stack.callback(lock.rollback)

        def unready() -> httpx.Response | None:
            response = client.get("/readyz", timeout=REQUEST_TIMEOUT)
            return response if response.status_code == 503 else None

        refused = wait_until(unready, timeout=60, message="/readyz says not ready")
        assert refused.json()["error"]["message"] in ("readiness check overdue", "database check timed out")
        lock.rollback()
        wait_until(lambda: client.get("/readyz").status_code == 200, timeout=60, message="ready again")


def _waiting_on_runs(lock: Connection) -> int:
    query = "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'runs'::regclass"
    return int(lock.execute(text(query)).scalar_one())


def test_a_probe_runs_ahead_of_the_requests_queued_before_it(make_settings: Callable[..., Settings]) -> None:
    """With the event loop held, reads arrive on many connections and then a probe: the probe is served first."""
    blocked, release = threading.Event(), threading.Event()
    started: list[str] = []  # paths in the order the app began serving them

    def prepare(app: FastAPI) -> None:
        @app.get("/test-block")
        async def block() -> dict[str, str]:
            blocked.set()
            release.wait(scaled(60))  # holds the event loop itself: what arrives meanwhile queues up
            return {}

        @app.get("/test-read")
        async def read() -> dict[str, str]:
            return {}

        app.add_middleware(_Recorder, started=started)

    with live_service(make_settings(), prepare) as live, ExitStack() as stack:
        stack.callback(release.set)
        reads = [stack.enter_context(_connection(live)) for _ in range(20)]
        probe = stack.enter_context(_connection(live))
        for connection in [*reads, probe]:  # connected and served once before the loop is held
            _send(connection, "/test-read")
            _response(connection)
        blocker = threading.Thread(target=_get, args=(live, "/test-block"), daemon=True)
        blocker.start()
        stack.callback(blocker.join, scaled(60))
        assert blocked.wait(scaled(60)), "the loop was not held"
        started.clear()
        for connection in reads:
            _send(connection, "/test-read")
        _send(probe, "/healthz")
        release.set()
        for connection in [*reads, probe]:
            assert _response(connection).startswith(b"HTTP/1.1 200")
        assert started[0] == "/healthz", started
        assert sorted(started[1:]) == ["/test-read"] * len(reads)


class _Recorder:
    def __init__(self, app: ASGIApp, started: list[str]) -> None:
        self.app, self.started = app, started

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.started.append(scope["path"])
        await self.app(scope, receive, send)


@contextmanager
def _connection(live: LiveService) -> Iterator[socket.socket]:
    host, port = live.base_url.removeprefix("http://").split(":")
    connection = socket.create_connection((host, int(port)), timeout=REQUEST_TIMEOUT)
    try:
        yield connection
    finally:
        connection.close()


def _send(connection: socket.socket, path: str) -> None:
    connection.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())


def _response(connection: socket.socket) -> bytes:
    """One whole response (the test routes answer with a Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += _receive(connection)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += _receive(connection)
    return head


def _receive(connection: socket.socket) -> bytes:
    chunk = connection.recv(65536)
    if not chunk:
        raise ConnectionError("the service closed the connection")
    return chunk


def _get(live: LiveService, path: str) -> None:
    httpx.get(live.base_url + path, timeout=REQUEST_TIMEOUT)
