"""The real service app, started two ways: in this process behind an ASGI client (`in_process_service`, the
default of API tests), or on a loopback port in a thread (`live_service`) where something outside the test process
must reach it over TCP (the CLI, a browser, the MCP client)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from anyio.from_thread import BlockingPortal
from fastapi import FastAPI
from fastapi.testclient import TestClient

from rlctl.service.app import create_app
from rlctl.service.http import server_config
from rlctl.service.settings import Settings
from rlctl.supervisor.ports import free_ports
from tests.support.waiting import REQUEST_TIMEOUT, scaled, wait_until

# How long one request may take: generous, since a loaded machine is slow and a hang fails the test anyway.


def free_port() -> int:
    return free_ports(1)[0]


@dataclass
class Service:
    """The app, its settings and a way to call it; `client()` carries the token of the settings unless told."""

    app: FastAPI
    settings: Settings

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        raise NotImplementedError

    def anonymous(self, headers: dict[str, str] | None = None) -> httpx.Client:
        """A client with exactly `headers`: no token unless they carry one."""
        raise NotImplementedError

    def _headers(self, token: str | None) -> dict[str, str]:
        token = token or (self.settings.api_token.get_secret_value() if self.settings.api_token else None)
        return {"Authorization": f"Bearer {token}"} if token else {}


@dataclass
class LiveService(Service):
    base_url: str = ""

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self._headers(token), timeout=REQUEST_TIMEOUT, **kwargs)

    def anonymous(self, headers: dict[str, str] | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=headers or {}, timeout=REQUEST_TIMEOUT)


class _AppClient(TestClient):
    """A client of an app whose lifespan already runs on `portal`: it shares that event loop, and entering it
    starts nothing (a TestClient's own `with` would start the app a second time)."""

    def __init__(self, app: FastAPI, portal: BlockingPortal, headers: dict[str, str]) -> None:
        # As an httpx client of a loopback server sees it: a 500 is a response (never an exception in the test),
        # redirects are not followed, the caller is 127.0.0.1.
        super().__init__(
            app,
            base_url="http://127.0.0.1",
            headers=headers,
            raise_server_exceptions=False,
            follow_redirects=False,
            client=("127.0.0.1", 50000),
        )
        self.portal = portal

    def __enter__(self) -> _AppClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@dataclass
class InProcessService(Service):
    portal: BlockingPortal | None = None

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        assert self.portal is not None, "the service has stopped"
        return _AppClient(self.app, self.portal, {**self._headers(token), **kwargs.pop("headers", {})})

    def anonymous(self, headers: dict[str, str] | None = None) -> httpx.Client:
        assert self.portal is not None, "the service has stopped"
        return _AppClient(self.app, self.portal, headers or {})


@contextmanager
def in_process_service(
    settings: Settings, prepare: Callable[[FastAPI], None] | None = None
) -> Iterator[InProcessService]:
    """The app with its lifespan running in this process (start-up, recovery, shutdown as in `rlctl serve`);
    requests go through the ASGI interface, no socket. `prepare` runs on the app before it starts."""
    app = create_app(settings)
    if prepare is not None:
        prepare(app)
    with TestClient(app, raise_server_exceptions=False) as lifespan:
        assert lifespan.portal is not None
        yield InProcessService(app, settings, lifespan.portal)


@contextmanager
def live_service(
    settings: Settings, prepare: Callable[[FastAPI], None] | None = None, port: int | None = None
) -> Iterator[LiveService]:
    """The app served on a loopback port (`port`, else a free one); `prepare` runs on the app before it starts (e.g.
    to register extra job kinds before recovery)."""
    app = create_app(settings)
    if prepare is not None:
        prepare(app)
    port = port or free_port()
    server = uvicorn.Server(server_config(app, "127.0.0.1", port))
    thread = threading.Thread(target=server.run, name=f"rlctl-test-{port}", daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: server.started, timeout=60, message="service start-up")
        yield LiveService(app, settings, base_url)
    finally:
        server.should_exit = True
        thread.join(timeout=scaled(30))
        # a shutdown that hangs is a defect of the service's (once: the readiness monitor's lost cancellation)
        assert not thread.is_alive(), f"the service on port {port} did not shut down within {scaled(30):.0f} s"
