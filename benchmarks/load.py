"""A bounded HTTP load generator for the benchmarks: N keep-alive connections for a few seconds, like `wrk`.

Each connection sends GET requests one after another (HTTP/1.1, keep-alive) until the time is up, and every
request's latency is kept. The client speaks just enough HTTP/1.1 over asyncio streams to read responses with a
Content-Length: a general-purpose client (httpx) costs several times more CPU per request than the service's
cheapest route, and on a small machine it would measure itself instead of the service.

    from benchmarks.load import run_load
    result = run_load("http://127.0.0.1:8080", ["/healthz"], connections=64, seconds=5)
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

MAX_SECONDS = 20.0  # the machine is shared: no load run may last longer


@dataclass
class LoadResult:
    seconds: float
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0  # transport errors and non-2xx answers

    @property
    def requests_per_s(self) -> float:
        return len(self.latencies_s) / self.seconds if self.seconds > 0 else 0.0

    def percentile_s(self, fraction: float) -> float:
        if not self.latencies_s:
            return float("nan")
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

    @property
    def median_s(self) -> float:
        return statistics.median(self.latencies_s) if self.latencies_s else float("nan")

    def describe(self) -> str:
        return (
            f"{self.requests_per_s:8.0f} req/s  p50 {self.median_s * 1000:7.1f} ms  "
            f"p99 {self.percentile_s(0.99) * 1000:7.1f} ms  errors {self.errors}"
        )


def run_load(base_url: str, paths: list[str], connections: int, seconds: float) -> LoadResult:
    """GET `paths` (in turn, per connection) over `connections` connections for `seconds` (at most MAX_SECONDS)."""
    return asyncio.run(_load(base_url, paths, connections, min(seconds, MAX_SECONDS)))


async def _load(base_url: str, paths: list[str], connections: int, seconds: float) -> LoadResult:
    parts = urlsplit(base_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    requests = [f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode() for path in paths]
    started = time.monotonic()
    deadline = started + seconds
    results = await asyncio.gather(
        *(_connection(host, port, requests, index, deadline) for index in range(connections))
    )
    result = LoadResult(seconds=time.monotonic() - started)
    for latencies, errors in results:
        result.latencies_s.extend(latencies)
        result.errors += errors
    return result


async def _connection(
    host: str, port: int, requests: list[bytes], offset: int, deadline: float
) -> tuple[list[float], int]:
    latencies: list[float] = []
    errors = 0
    turn = offset
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    while time.monotonic() < deadline:
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, port)
            assert reader is not None
            sent = time.monotonic()
            writer.write(requests[turn % len(requests)])
            status, keep_alive = await _read_response(reader)
            latencies.append(time.monotonic() - sent)
            errors += not 200 <= status < 300
            if not keep_alive:
                writer.close()
                writer = None
        except (OSError, asyncio.IncompleteReadError, ValueError):
            errors += 1
            if writer is not None:
                writer.close()
            writer = None
            await asyncio.sleep(0.01)  # a refused connection must not spin
        turn += 1
    if writer is not None:
        writer.close()
    return latencies, errors


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """(status, whether the connection stays open); the body is read and dropped."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    if "content-length" not in headers:
        raise ValueError("a response without Content-Length")
    await reader.readexactly(int(headers["content-length"]))
    return status, headers.get("connection", "").lower() != "close"
