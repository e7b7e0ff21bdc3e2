"""A stand-in for the W&B server (a paid remote service) as a real HTTP server on loopback.

W&B's clients talk HTTP to WANDB_BASE_URL, so the faults that matter are faults of a real socket: a port that
refuses connections (nothing listens), one that accepts and never answers (a black hole), and a server that
answers but rejects the key (401). A mock of the client library would skip exactly the waits that blocked runs.

- `refusing_url()`: a loopback URL nobody listens on.
- `WandbStandin("silent")`: accepts connections, reads nothing, answers nothing, until closed.
- `WandbStandin("reject")`: answers every request 401, as W&B does for a bad key.
- `WandbStandin("accept")`: answers the `viewer` query with a user, as W&B does for a good key.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

from tests.support.live import free_port

Mode = Literal["silent", "reject", "accept"]


def refusing_url() -> str:
    """A loopback port with no listener: connections are refused at once."""
    return f"http://127.0.0.1:{free_port()}"


class WandbStandin:
    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self.requests: list[tuple[str, str]] = []  # (method, path) of what was answered
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._silent: socket.socket | None = None
        self._http: ThreadingHTTPServer | None = None
        self.url = ""

    def __enter__(self) -> WandbStandin:
        if self.mode == "silent":
            self._silent = socket.create_server(("127.0.0.1", 0), backlog=64)
            self._silent.settimeout(0.2)
            self.url = f"http://127.0.0.1:{self._silent.getsockname()[1]}"
            self._start(self._hold_connections)
        else:
            self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
            self._http.daemon_threads = True
            self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
            self._start(self._http.serve_forever)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._closed.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        if self._silent is not None:
            self._silent.close()
        for thread in self._threads:
            thread.join(timeout=10)

    def _start(self, target: object) -> None:
        thread = threading.Thread(target=target, name=f"wandb-standin-{self.mode}", daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _hold_connections(self) -> None:
        held: list[socket.socket] = []
        assert self._silent is not None
        while not self._closed.is_set():
            try:
                connection, _ = self._silent.accept()
            except (TimeoutError, OSError):
                continue
            held.append(connection)  # never read, never answered, closed only at the end
        for connection in held:
            connection.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self._answer()

            def do_GET(self) -> None:  # noqa: N802
                self._answer()

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                standin.requests.append((self.command, self.path))
                if standin.mode == "reject":
                    status, body = 401, {"errors": [{"message": "user is not logged in"}]}
                else:
                    status, body = 200, {"data": {"viewer": {"id": "VXNlcjox", "username": "standin"}}}
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        return Handler
