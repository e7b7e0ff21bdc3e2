"""A bounded HTTP load for the benchmarks: N keep-alive connections for a few seconds, from `wrk` when installed.

`wrk` (C, several threads) holds 200 keep-alive connections the way real clients do and costs the machine
little; it is what showed issue 40's seconds-long tail. Without it, a generator of this file stands in: the
connections spread over a few processes (one Python process cannot saturate the service and hides the tail),
each speaking just enough HTTP/1.1 over asyncio streams (a general-purpose client like httpx costs several times
the CPU of the service's cheapest route and would measure itself instead). Probes come at a pace instead
(`run_paced`), as an orchestrator sends them.

    from benchmarks.load import run_load, run_beside, run_paced
    result = run_load("http://127.0.0.1:8080", ["/healthz"], connections=64, seconds=5)
    idle = run_paced("http://127.0.0.1:8081", ["/healthz"], per_second=200, seconds=5)
    probes, reads = run_beside(base_url, ["/runs/abc"], 200, 5, lambda: run_paced(probe_url, ["/healthz"], 200, 5))
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

MAX_SECONDS = 20.0  # the machine is shared: no load run may last longer
PROCESSES = max(1, min(4, os.cpu_count() or 1))  # of the fallback generator
# wrk's own time-out (2 s by default) would drop the slowest answers from its latencies: the tail is the point.
WRK_TIMEOUT = "60s"
# wrk's script: every connection takes `paths` in turn, and the summary is printed in microseconds at the end.
_WRK_SCRIPT = """
local paths = {%s}
local turn = 0
request = function()
  turn = turn + 1
  return wrk.format("GET", paths[(turn %% #paths) + 1])
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RLCTL-LOAD %%d %%d %%d %%d %%d %%d %%d\\n", summary.requests, summary.duration,
    e.connect + e.read + e.write + e.timeout + e.status, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max))
end
"""
_WRK_SUMMARY = re.compile(r"RLCTL-LOAD (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)")


@dataclass
class LoadResult:
    seconds: float
    latencies_s: list[float] = field(default_factory=list)  # every request's (the fallback generator)
    errors: int = 0  # transport errors, time-outs and non-2xx answers
    requests: int = 0
    quantiles_s: dict[float, float] = field(default_factory=dict)  # as wrk reports them (no single latencies)
    tool: str = "python"

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    def percentile_s(self, fraction: float) -> float:
        if fraction in self.quantiles_s:
            return self.quantiles_s[fraction]
        if not self.latencies_s:
            return float("nan")
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

    @classmethod
    def pooled(cls, parts: list[LoadResult], tool: str) -> LoadResult:
        """One result of loads of single latencies, run one after the other (`seconds` adds up) or at once."""
        result = cls(seconds=sum(part.seconds for part in parts), tool=tool)
        for part in parts:
            result.latencies_s.extend(part.latencies_s)
            result.errors += part.errors
        result.requests = len(result.latencies_s)
        return result

    @property
    def median_s(self) -> float:
        return self.percentile_s(0.5)

    def describe(self) -> str:
        return (
            f"{self.requests_per_s:8.0f} req/s  p50 {self.median_s * 1000:7.1f} ms  "
            f"p90 {self.percentile_s(0.9) * 1000:7.1f} ms  p99 {self.percentile_s(0.99) * 1000:7.1f} ms  "
            f"errors {self.errors}  ({self.tool})"
        )


def has_wrk() -> bool:
    return shutil.which("wrk") is not None


def run_load(base_url: str, paths: list[str], connections: int, seconds: float) -> LoadResult:
    """GET `paths` (in turn, per connection) over `connections` connections for `seconds` (at most MAX_SECONDS)."""
    seconds = min(seconds, MAX_SECONDS)
    if has_wrk():
        return _wrk(base_url, paths, connections, seconds)
    return _processes(base_url, paths, connections, seconds)


def run_beside(
    base_url: str, read_paths: list[str], connections: int, seconds: float, probes: Callable[[], LoadResult]
) -> tuple[LoadResult, LoadResult]:
    """Two loads at once: `probes()` (`run_paced`, or `run_load` of a few connections) beside reads of
    `read_paths` on `connections` connections for `seconds`; their results."""
    results: dict[str, LoadResult] = {}

    def reads() -> None:
        results["reads"] = run_load(base_url, read_paths, connections, seconds)

    thread = threading.Thread(target=reads)
    thread.start()
    try:
        probed = probes()
    finally:
        thread.join()
    return probed, results["reads"]


def _wrk(base_url: str, paths: list[str], connections: int, seconds: float) -> LoadResult:
    listed = ", ".join(f'"{path}"' for path in paths)
    with tempfile.TemporaryDirectory(prefix="rlctl-wrk-") as tmp:
        script = Path(tmp) / "load.lua"
        script.write_text(_WRK_SCRIPT % listed)
        threads = max(1, min(2, connections))
        command = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:.0f}s", f"--timeout={WRK_TIMEOUT}"]
        output = subprocess.run(
            [*command, "-s", str(script), base_url], capture_output=True, text=True, check=True, timeout=seconds + 90
        ).stdout
    match = _WRK_SUMMARY.search(output)
    if match is None:
        raise RuntimeError(f"wrk printed no summary:\n{output}")
    requests, duration_us, errors, p50, p90, p99, _max = (int(value) for value in match.groups())
    quantiles = {0.5: p50 / 1e6, 0.9: p90 / 1e6, 0.99: p99 / 1e6}
    return LoadResult(seconds=duration_us / 1e6, errors=errors, requests=requests, quantiles_s=quantiles, tool="wrk")


def _processes(base_url: str, paths: list[str], connections: int, seconds: float) -> LoadResult:
    """The fallback: the connections spread over PROCESSES processes, their latencies merged."""
    processes = max(1, min(PROCESSES, connections))
    shares = [connections // processes + (index < connections % processes) for index in range(processes)]
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        parts = pool.starmap(_process_load, [(base_url, paths, share, seconds) for share in shares])
    result = LoadResult.pooled(parts, tool=f"python x{processes}")
    result.seconds = max(part.seconds for part in parts)  # they ran at once
    return result


def _process_load(base_url: str, paths: list[str], connections: int, seconds: float) -> LoadResult:
    return asyncio.run(_load(base_url, paths, connections, seconds))


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
    result.requests = len(result.latencies_s)
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
    status, headers = _parsed_head(await reader.readuntil(b"\r\n\r\n"))
    await reader.readexactly(int(headers["content-length"]))
    return status, headers.get("connection", "").lower() != "close"


def _parsed_head(head: bytes) -> tuple[int, dict[str, str]]:
    """An answer's status and headers (lower-cased names), from its head; the benchmarks' answers all say their
    body's length."""
    lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    if "content-length" not in headers:
        raise ValueError("a response without Content-Length")
    return status, headers


def run_paced(base_url: str, paths: list[str], per_second: float, seconds: float) -> LoadResult:
    """GET `paths` in turn, `per_second` of them on one keep-alive connection for `seconds` (at most MAX_SECONDS),
    the way an orchestrator probes: at a pace, not as fast as answers come back, so each latency is an answer's
    and not a queue's that the load generator made (a closed loop of a few connections keeps a cheap server
    saturated, and compares two saturated states). A request answered after the next one was due holds that one
    up, whose latency counts from when it was due (no coordinated omission); a server slower than the pace
    gets fewer requests, not a longer run. In a process of its own, with a blocking socket and `time.sleep`
    (asyncio's timers round up to the millisecond, more than an answer takes)."""
    seconds = min(seconds, MAX_SECONDS)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        return pool.apply(_paced, (base_url, paths, per_second, seconds))


def _paced(base_url: str, paths: list[str], per_second: float, seconds: float) -> LoadResult:
    parts = urlsplit(base_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    requests = [f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode() for path in paths]
    result = LoadResult(seconds=seconds, tool=f"paced, {per_second:g}/s")
    with socket.create_connection((host, port)) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        answers = connection.makefile("rb")
        started = time.monotonic()
        for turn in range(int(seconds * per_second)):
            due = started + turn / per_second
            if time.monotonic() > started + seconds:
                break
            time.sleep(max(0.0, due - time.monotonic()))
            connection.sendall(requests[turn % len(requests)])
            result.errors += not 200 <= _read_answer(answers) < 300
            result.latencies_s.append(time.monotonic() - due)
    result.requests = len(result.latencies_s)
    return result


def _read_answer(answers: BinaryIO) -> int:
    """The status of the next answer (`_read_response`'s, from a blocking socket); its body is read and dropped."""
    lines = [answers.readline()]
    while lines[-1] not in (b"\r\n", b""):
        lines.append(answers.readline())
    if lines[-1] == b"":
        raise ConnectionError("the server closed the connection")
    status, headers = _parsed_head(b"".join(lines))
    answers.read(int(headers["content-length"]))
    return status
