"""The cost of the terminal sandbox's layers, per call: what a `terminal` call of `true` (and of a fetch from a
loopback HTTP server) takes, as a ratio to a bare bubblewrap call measured in the same run.

    .venv/bin/python benchmarks/sandbox_calls.py [--calls 20]

Variants, each `--calls` times in turn (interleaved, so that the machine's load weighs on all alike):
  - baseline: `bwrap --unshare-all --ro-bind /usr /usr … true` alone (no limits, no seccomp, no cgroup);
  - sandbox: the tool's whole sandbox (seccomp filter, memory cgroup where one can be made, prlimit, and as root
    the privileged mount view and setpriv);
  - sandbox + network: the same with one named loopback destination (the gate and the relay started);
  - fetch: `curl` of a loopback HTTP server through the gate's proxy, in a sandbox with network;
  - kept item: a call in an item's kept sandbox (its work directory a tmpfs of its own, joined with nsenter);
  - fresh item per call: the same, the item (its keeper and tmpfs) made and ended around each call.
Printed: median and p90 wall time per variant and the median's ratio to the baseline, and the memory mode.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from rlctl.sandbox.bubblewrap import SandboxCall, find_sandbox  # noqa: E402
from rlctl.sandbox.netgate import NetworkPolicy, parse_allowed_ranges, parse_destination  # noqa: E402
from rlctl.service.settings import Settings  # noqa: E402


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *args: object) -> None:
        pass


def _succeeds(call: SandboxCall) -> None:
    """Reads the call's output to its end and checks that it exited 0 (the output shown where not)."""
    assert call.process.stdout is not None
    output = call.process.stdout.read()
    assert call.process.wait() == 0, output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    settings = Settings(_env_file=None)
    sandbox = find_sandbox(settings.sandbox_bwrap, settings.sandbox_uid)
    if isinstance(sandbox, str):
        print(f"no sandbox here: {sandbox}")
        return 1
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    policy = NetworkPolicy((parse_destination(f"127.0.0.1:{port}"),), parse_allowed_ranges("127.0.0.1/32"))
    work = Path(tempfile.mkdtemp(prefix="rlctl-bench-sandbox-"))
    sandbox.prepare(work)
    bare = [sandbox.bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib64"):
        bare += ["--symlink", f"usr/{name}", f"/{name}"]
    bare += ["--proc", "/proc", "--dev", "/dev", "--", "/bin/true"]

    def in_sandbox(command: str, network: NetworkPolicy | None) -> Callable[[], None]:
        def run() -> None:
            with sandbox.start(work, command, network) as call:
                _succeeds(call)

        return run

    kept = sandbox.item(Path(tempfile.mkdtemp(prefix="rlctl-bench-item-")))

    def in_item() -> None:
        with kept.start("true") as call:
            _succeeds(call)

    def fresh_item() -> None:
        with sandbox.item(Path(tempfile.mkdtemp(prefix="rlctl-bench-item-"))) as item, item.start("true") as call:
            _succeeds(call)

    variants: dict[str, Callable[[], None]] = {
        "baseline (bare bwrap)": lambda: subprocess.run(bare, check=True, capture_output=True),
        "sandbox": in_sandbox("true", None),
        "sandbox + network": in_sandbox("true", policy),
        "fetch through the gate": in_sandbox(f"curl -sSf http://127.0.0.1:{port}/ >/dev/null", policy),
        f"kept item ({kept.disk_mode})": in_item,
        "fresh item per call": fresh_item,
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.calls):
        for name, variant in variants.items():
            started = time.perf_counter()
            variant()
            times[name].append(time.perf_counter() - started)
    server.shutdown()
    kept.close()
    base = statistics.median(times["baseline (bare bwrap)"])
    print(f"memory mode: {sandbox.memory_mode}; {args.calls} calls per variant")
    for name, values in times.items():
        ordered = sorted(values)
        median, p90 = statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))]
        print(f"{name:28s} median {median * 1000:7.1f} ms  p90 {p90 * 1000:7.1f} ms  ratio {median / base:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
