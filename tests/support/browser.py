"""A real headless Chromium (Debian's package), driven over the DevTools protocol; no browser is downloaded.

with headless_chromium(tmp_path) as browser:
    browser.navigate(url)
    browser.wait_for("document.title === 'rlctl'", timeout=30)
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import psutil
from websockets.sync.client import ClientConnection, connect

from tests.support.waiting import REQUEST_TIMEOUT, wait_until

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",  # the tests run as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1000",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",  # Chromium picks a free port and writes it to DevToolsActivePort
]


def chromium_executable() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One page target; `events` collects what the page reported (exceptions, log entries)."""

    def __init__(self, connection: ClientConnection) -> None:
        self.connection = connection
        self.events: list[dict[str, Any]] = []
        self._ids = itertools.count(1)

    def send(self, method: str, timeout: float = 60, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        self.connection.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.connection.recv(timeout=timeout))
            if message.get("id") == message_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def wait_for(self, expression: str, timeout: float, message: str = "") -> Any:
        return wait_until(lambda: self.evaluate(expression), timeout, interval=0.1, message=message or expression)

    def screenshot(self) -> bytes:
        return base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])

    def page_errors(self) -> list[dict[str, Any]]:
        """Uncaught exceptions and error-level log entries (e.g. a blocked script) the page reported."""
        return [
            event
            for event in self.events
            if event["method"] == "Runtime.exceptionThrown"
            or (event["method"] == "Log.entryAdded" and event["params"]["entry"]["level"] == "error")
        ]


@contextmanager
def headless_chromium(work_dir: Path, executable: str) -> Iterator[Browser]:
    profile = work_dir / "chromium-profile"
    profile.mkdir(parents=True)
    log = (work_dir / "chromium.log").open("wb")
    process = subprocess.Popen(
        [executable, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    try:
        port = wait_until(lambda: _devtools_port(profile, process), timeout=60, message="chromium's DevTools port")
        targets = wait_until(
            lambda: [
                t
                for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=REQUEST_TIMEOUT).json()
                if t["type"] == "page"
            ],
            timeout=30,
            message="a page target",
        )
        with connect(targets[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as connection:
            browser = Browser(connection)
            for domain in ("Page", "Runtime", "Log"):
                browser.send(f"{domain}.enable")
            yield browser
    finally:
        _stop(process)


def _devtools_port(profile: Path, process: subprocess.Popen) -> int | None:
    if process.poll() is not None:
        raise RuntimeError(f"chromium exited with {process.returncode}")
    try:
        first_line = (profile / "DevToolsActivePort").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    return int(first_line) if first_line.isdigit() else None


def _stop(process: subprocess.Popen) -> None:
    """Chromium and every helper process it started (renderers, zygotes), even those that left its group."""
    try:
        family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        with suppress(psutil.NoSuchProcess):
            member.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(family, timeout=10)
    for member in alive:
        with suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(alive, timeout=10)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
