"""A small real process for supervisor tests: serves /health, exits when told, ignores SIGTERM if asked.

python -m tests.support.fake_process [--port P] [--exit-after S] [--code C] [--ignore-sigterm]
                                     [--grandchild] [--ready-after S]
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import subprocess
import sys
import threading
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int)
    parser.add_argument("--exit-after", type=float)
    parser.add_argument("--code", type=int, default=0)
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--grandchild", action="store_true")
    parser.add_argument("--ready-after", type=float, default=0.0)
    args = parser.parse_args()

    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.grandchild:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"grandchild {child.pid}", flush=True)
    print(f"started pid {os.getpid()}", flush=True)
    if args.port:
        ready_at = time.monotonic() + args.ready_after
        threading.Thread(target=_serve, args=(args.port, ready_at), daemon=True).start()
    deadline = time.monotonic() + args.exit_after if args.exit_after is not None else None
    while deadline is None or time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"exiting with {args.code}", flush=True)
    return args.code


def _serve(port: int, ready_at: float) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self.send_response(200 if time.monotonic() >= ready_at else 503)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    raise SystemExit(main())
