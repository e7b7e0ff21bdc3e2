"""The real service on a loopback port, in a thread of the test process."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn
from fastapi import FastAPI

from service.app import create_app
from service.settings import Settings
from supervisor.ports import free_ports
from tests.support.waiting import wait_until


def free_port() -> int:
    return free_ports(1)[0]


@dataclass
class LiveService:
    base_url: str
    app: FastAPI
    settings: Settings

    def client(self, token: str | None = None, **kwargs: object) -> httpx.Client:
        token = token or (self.settings.api_token.get_secret_value() if self.settings.api_token else None)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=120, **kwargs)


@contextmanager
def live_service(settings: Settings, prepare: Callable[[FastAPI], None] | None = None) -> Iterator[LiveService]:
    """`prepare` runs on the app before it starts (e.g. to register extra job kinds before recovery)."""
    app = create_app(settings)
    if prepare is not None:
        prepare(app)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
    thread = threading.Thread(target=server.run, name=f"rlctl-test-{port}", daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: server.started, timeout=60, message="service start-up")
        yield LiveService(base_url, app, settings)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
