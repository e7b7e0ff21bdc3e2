"""Liveness and readiness probes stay answered while the service is busy (issue 40: a probe must not fail during a
read burst). The service is served as `rlctl serve` serves it (`rlctl.service.http.server_config`), on loopback."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import httpx
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from rlctl.service.db.engine import REQUEST_THREADS
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
