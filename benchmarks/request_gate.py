"""/healthz while callers without a token send large bodies: the authentication gate answers them from the headers.

    .venv/bin/python benchmarks/request_gate.py [--attackers 8] [--body-mb 16] [--rounds 40]

A real `rlctl serve` process (SQLite, a fresh data dir, RLCTL_API_TOKEN set) gets:
  1. baseline: /healthz, sequentially, with nothing else to do (p50, p99, max);
  2. attack: `--attackers` threads each POST `--rounds` bodies of `--body-mb` MB of JSON to /collections without
     a token (each declares its length and sends the whole body unless the service answers first), /healthz
     polled meanwhile; the ratio of its p99 to the baseline's, measured in the same run;
  3. the answers the attackers got (goal: all 401) and the service's peak RSS (sampled every 20 ms).
Before the gate, each such body was parsed as JSON before the token was checked: eight at once held /healthz for
up to 4.4 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.datasets import start_service, stop_service  # noqa: E402
from benchmarks.security import MEGABYTE, percentiles, poll_health  # noqa: E402

TOKEN = "bench-gate-token-0123456789abcdef"


def attack(port: int, body: bytes, rounds: int, answers: Counter[str]) -> None:
    """`rounds` POSTs of `body` without a token, each on its own connection (the service closes it after a 401
    it answered before the body ended)."""
    head = (
        f"POST /collections HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    for _ in range(rounds):
        with socket.create_connection(("127.0.0.1", port), timeout=120) as connection:
            with contextlib.suppress(OSError):  # answered and closed before the whole body was sent
                connection.sendall(head + body)
            answers[status_of(connection)] += 1


def status_of(connection: socket.socket) -> str:
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = connection.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        return type(exc).__name__
    return data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "no answer"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attackers", type=int, default=8)
    parser.add_argument("--body-mb", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--baseline-requests", type=int, default=300)
    arguments = parser.parse_args()
    prompt = "x" * (arguments.body_mb * MEGABYTE - 100)
    body = json.dumps({"environment": "e", "model": "m", "prompts": [prompt]}).encode()
    with tempfile.TemporaryDirectory(prefix="rlctl-gate-bench-") as scratch:
        service = start_service(Path(scratch) / "var", {"RLCTL_API_TOKEN": TOKEN, "RLCTL_WARM_UP": "false"})
        try:
            port = int(service.base_url.rsplit(":", 1)[1])
            baseline: list[float] = []
            done = threading.Event()
            poller = threading.Thread(target=poll_health, args=(service.base_url, done, baseline))
            poller.start()
            while len(baseline) < arguments.baseline_requests:
                time.sleep(0.05)
            done.set()
            poller.join()
            service.reset_peak()
            rss_idle = service.peak_rss
            answers: Counter[str] = Counter()
            under_attack: list[float] = []
            done = threading.Event()
            poller = threading.Thread(target=poll_health, args=(service.base_url, done, under_attack))
            attackers = [
                threading.Thread(target=attack, args=(port, body, arguments.rounds, answers))
                for _ in range(arguments.attackers)
            ]
            started = time.perf_counter()
            poller.start()
            for thread in attackers:
                thread.start()
            for thread in attackers:
                thread.join()
            elapsed = time.perf_counter() - started
            done.set()
            poller.join()
        finally:
            stop_service(service)
    idle, attacked = percentiles(baseline), percentiles(under_attack)
    figures = {
        "attack": f"{arguments.attackers} attackers x {arguments.rounds} POSTs of {len(body) / MEGABYTE:.1f} MB, "
        f"no token, in {elapsed:.1f} s",
        "/healthz idle": idle,
        "/healthz under attack": attacked,
        "p99 ratio (attack / idle)": attacked["p99_ms"] / idle["p99_ms"],
        "answers to the attackers": dict(answers),
        "rss idle MiB": rss_idle / MEGABYTE,
        "peak rss MiB": service.peak_rss / MEGABYTE,
    }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
