"""Start-up benchmark: POST /runs -> `running` for an offline echo run on the local backend (issue 18).

    .venv/bin/python benchmarks/startup.py [--repo PATH] [--together 10] [--rounds 3] [--first-after 0]
        [--fork-server both]

A real `rlctl serve` of the checkout at --repo (default: this one; its .venv's Python) starts on a fresh data
directory and SQLite. Then, one after another:
- the first run, POSTed as soon as /readyz answers (after --first-after seconds): it includes whatever the
  service still has to do once (config schema, tiny model);
- then --rounds times: two later runs, each alone (the lone start: the median of all of them), and --together
  runs POSTed at once: each one's POST -> running, the slowest against the lone start, and the CPU the whole
  machine spent meanwhile (with two cores, the slowest cannot come sooner than half of it).
Each run is stopped (and waited for) before the next measure. Prints the load average before and after; the
goal is first and lone <= 6 s on an idle machine, and every run of the ten <= 2x the lone start. By default the
service is measured twice, without the fork server (docs/RUNS.md#the-fork-server) and with it, with the ratios.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from rlctl.supervisor.ports import free_ports  # noqa: E402

TERMINAL = ("failed", "completed", "stopped")
ANSWERED: list[float] = []  # seconds each POST /runs took to answer (201)
CREATED: list[str] = []  # every run started, stopped before the service ends (runs outlive their service)
POLL_S = 0.1  # ten runs polled at once: 100 reads a second, a small load beside ten start-ups


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the checkout whose service is measured")
    parser.add_argument("--together", type=int, default=10, help="runs started at once")
    parser.add_argument("--rounds", type=int, default=3, help="lone starts and starts together, measured again")
    parser.add_argument("--first-after", type=float, default=0.0, help="seconds between /readyz and the first POST")
    parser.add_argument(
        "--fork-server",
        choices=("on", "off", "both"),
        default="both",
        help="RLCTL_FORK_SERVER of the service; both: off (the baseline), then on, and the ratios",
    )
    args = parser.parse_args()
    repo = args.repo.resolve()
    modes = {"on": [True], "off": [False], "both": [False, True]}[args.fork_server]
    found = {mode: _measure(repo, mode, args.together, args.rounds, args.first_after) for mode in modes}
    if len(found) == 2:
        off, on = found[False], found[True]
        print("fork server on / off: " + "  ".join(f"{name} {on[name] / off[name]:.2f}x" for name in off))


def _measure(repo: Path, fork_server: bool, together_count: int, rounds: int, first_after: float) -> dict[str, float]:
    print(f"repo {repo}  RLCTL_FORK_SERVER={str(fork_server).lower()}  load before: {_load()}")
    ANSWERED.clear()
    CREATED.clear()
    with (
        tempfile.TemporaryDirectory(prefix="rlctl-startup-") as tmp,
        _service(repo, Path(tmp), fork_server) as (client, ready_s),
    ):
        print(f"service start -> /readyz:      {ready_s:6.2f} s")
        time.sleep(first_after)
        first = _start_and_stop(client)
        print(
            f"first run  POST -> running:    {first:6.2f} s   (/readyz + {first_after:g} s; "
            f"the POST answered in {ANSWERED[0]:.2f} s)"
        )
        lones: list[float] = []
        slowest: list[float] = []
        for _round in range(rounds):
            lones += [_start_and_stop(client), _start_and_stop(client)]
            busy_before = _machine_busy_s()
            with ThreadPoolExecutor(together_count) as pool:
                together = list(pool.map(lambda _: _to_running(client), range(together_count)))
            busy = _machine_busy_s() - busy_before
            for run_id, _ in together:
                _retried(lambda run_id=run_id: client.post(f"/runs/{run_id}/stop", params={"wait_s": 120}))
            times = sorted(seconds for _, seconds in together)
            slowest.append(times[-1])
            print(
                f"{together_count} together POST -> running: min {times[0]:.2f}  median "
                f"{statistics.median(times):.2f}  max {times[-1]:.2f} s; the machine's CPU meanwhile {busy:.1f} s "
                f"({busy / together_count:.2f} s a start; {os.cpu_count()} cores: no sooner than "
                f"{busy / (os.cpu_count() or 1):.2f} s)"
            )
        lone = statistics.median(lones)
        print(f"later runs POST -> running:    {lone:6.2f} s   (the lone start, median of {len(lones)})")
        print(
            f"slowest of {together_count} together, median of {rounds}: {statistics.median(slowest):.2f} s = "
            f"{statistics.median(slowest) / lone:.2f}x the lone start"
        )
    print(f"load after: {_load()}")
    return {"first": first, "lone": lone, "slowest_together": statistics.median(slowest)}


def _machine_busy_s() -> float:
    """CPU-seconds every core of the machine has spent busy (not idle, not waiting on I/O) since it booted."""
    ticks = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _start_and_stop(client: httpx.Client) -> float:
    run_id, seconds = _to_running(client)
    _retried(lambda: client.post(f"/runs/{run_id}/stop", params={"wait_s": 120}))
    return seconds


def _to_running(client: httpx.Client) -> tuple[str, float]:
    started = time.monotonic()
    body = {"environment": "echo", "backend": "local", "idempotency_key": uuid.uuid4().hex}
    run_id = _retried(lambda: client.post("/runs", json=body)).json()["id"]
    CREATED.append(run_id)
    ANSWERED.append(time.monotonic() - started)
    deadline = started + 900
    while time.monotonic() < deadline:
        run = _retried(lambda: client.get(f"/runs/{run_id}")).json()
        if run["status"] == "running":
            return run_id, time.monotonic() - started
        if run["status"] in TERMINAL:
            raise RuntimeError(f"run {run_id} ended {run['status']}: {run.get('failure')}")
        time.sleep(POLL_S)
    raise TimeoutError(f"run {run_id} was not running within 900 s")


def _retried(call: Callable[[], httpx.Response]) -> httpx.Response:
    """A kept-alive connection the server closed meanwhile is tried again (the POST is idempotent by its key)."""
    for attempt in range(5):
        try:
            response = call()
            response.raise_for_status()
            return response
        except httpx.TransportError:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


class _service:
    """`rlctl serve` of `repo` on a fresh data directory; yields a client and the seconds until /readyz."""

    def __init__(self, repo: Path, tmp: Path, fork_server: bool) -> None:
        self.repo, self.tmp, self.fork_server = repo, tmp, fork_server
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> tuple[httpx.Client, float]:
        port = free_ports(1)[0]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLCTL_")}
        env.update(
            RLCTL_DATA_DIR=str(self.tmp / "var"),
            RLCTL_LOCAL_TOTAL_STEPS="100000",
            RLCTL_LOG_LEVEL="WARNING",
            RLCTL_STOP_GRACE_S="5",
            RLCTL_FORK_SERVER=str(self.fork_server).lower(),
        )
        python = self.repo / ".venv" / "bin" / "python"
        started = time.monotonic()
        self.process = subprocess.Popen(
            [str(python), "-m", "rlctl.service.cli", "serve", "--port", str(port)],
            cwd=self.repo,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=(self.tmp / "service.log").open("wb"),
        )
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300)
        deadline = started + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the service exited: {(self.tmp / 'service.log').read_text()[-2000:]}")
            try:
                if self.client.get("/readyz").status_code == 200:
                    return self.client, time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError("the service was not ready within 300 s")

    def __exit__(self, *exc: object) -> None:
        for run_id in CREATED:
            try:
                if self.client.get(f"/runs/{run_id}").json()["status"] not in TERMINAL:
                    self.client.post(f"/runs/{run_id}/stop", params={"wait_s": 120})
            except httpx.HTTPError as error:
                print(f"could not stop run {run_id}: {error}", file=sys.stderr)
        self.client.close()
        if self.process is not None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=60)


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


if __name__ == "__main__":
    main()
