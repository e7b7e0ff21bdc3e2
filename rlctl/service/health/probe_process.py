"""The probe listener's process: `python -m rlctl.service.health.probe_process STATE PORT_FILE HOST PORT STALL_S`.

It answers `/healthz` and `/readyz` from the state file the service rewrites every half second
(rlctl/service/health/listener.py): a process of its own, so a probe waits neither for the service's event loop
nor for its interpreter lock. Standard library only (it starts in tens of milliseconds). It writes the port it
listens on to PORT_FILE once listening (PORT 0 picks a free one), and ends with the service (the kernel's
parent-death signal, set by the supervisor that starts it).

State: `{"ticked_at": the service's time.monotonic() at its event loop's last turn (the clock is the machine's,
the same in every process), "unavailable": the service's 503 error code, "ready": [status, body]}`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def answer(state_path: Path, path: str, stall_s: float) -> tuple[int, dict[str, Any]]:
    """(status, body) of a probe at `path`, from the service's newest state."""
    try:
        state = json.loads(state_path.read_text())
    except (OSError, ValueError):  # not written yet (the service is starting), or mid-replace on a slow disk
        return 503, _error("UNAVAILABLE", "starting", {})
    if path not in ("/healthz", "/readyz"):
        return 404, _error("NOT_FOUND", "the probe listener answers /healthz and /readyz", {"path": path})
    since = time.monotonic() - float(state["ticked_at"])
    if since > stall_s:  # neither live nor ready: the readiness it holds is as old as the loop's last turn
        return 503, _error(state["unavailable"], "event loop stalled", {"seconds_since_tick": round(since, 1)})
    if path == "/healthz":
        return 200, {"status": "ok"}
    status, body = state["ready"]
    return int(status), body


def _error(code: str, message: str, details: dict[str, Any]) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details}}


def serve(state_path: Path, port_file: Path, host: str, port: int, stall_s: float) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as orchestrators' probes and load generators use it

        def setup(self) -> None:
            super().setup()
            # headers and body go out in two writes: without this, Nagle's algorithm holds the body until the
            # client's delayed ACK (40 ms a probe on Linux)
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            status, body = answer(state_path, self.path.split("?", 1)[0], stall_s)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            """Probes are not logged: an orchestrator sends one every few seconds."""

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    written = port_file.with_suffix(".tmp")
    written.write_text(str(server.server_address[1]))
    os.replace(written, port_file)
    server.serve_forever()


def main(argv: list[str]) -> int:
    state, port_file, host, port, stall_s = argv
    serve(Path(state), Path(port_file), host, int(port), float(stall_s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
