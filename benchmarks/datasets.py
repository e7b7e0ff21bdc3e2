"""Throughput and memory of the dataset service on long generated agent trajectories.

    .venv/bin/python benchmarks/datasets.py [--sizes 1000,5000] [--keep]

For each size, a JSON Lines file of that many OpenAI-format agent trajectories (reasoning, tool calls, long tool
outputs; at least 40k tokens each) is generated, then a real `rlctl serve` process (SQLite, a fresh data dir)
gets, over HTTP:
  1. the upload, streamed from disk as the raw body (5,000 records make about 1 GB),
  2. compress with the default parameters and the extractive summariser,
  3. score with correctness + format.
Printed per phase: records/s, tokens/s (the approximate counter's tokens of the input) and the service's peak RSS,
sampled every 20 ms. The baseline, measured in this process on the same stored records: tokenising every record
once (reading, parsing and counting each turn); compression time is given as a ratio to it. Peak RSS must stay
flat from the small size to the large one: memory is bounded by a record, not a dataset.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlctl.supervisor.ports import free_ports  # noqa: E402
from rlctl.trajectories.records import record_from_dict  # noqa: E402
from rlctl.trajectories.tokens import ApproximateTokenCounter  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
WORDS = (
    "the",
    "agent",
    "reads",
    "file",
    "config",
    "value",
    "error",
    "test",
    "function",
    "return",
    "import",
    "class",
    "module",
    "path",
    "output",
    "data",
    "result",
    "check",
    "update",
    "build",
    "run",
    "install",
    "package",
    "version",
    "request",
    "response",
    "server",
    "client",
    "cache",
    "index",
    "query",
    "table",
    "row",
)
STEPS_PER_TRAJECTORY = 30


# --- generated trajectories ---


def _pool(rng: random.Random) -> tuple[list[str], list[str]]:
    paragraphs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(50, 90))) + "." for _ in range(64)]
    code = []
    for block in range(64):
        lines = []
        for line in range(120):
            name = f"{rng.choice(WORDS)}_{block}_{line}"
            lines.append(f"    {name} = compute({rng.randint(0, 9999)}, '{rng.choice(WORDS)}')  # {rng.choice(WORDS)}")
        code.append("\n".join(lines))
    return paragraphs, code


def trajectory(index: int, rng: random.Random, paragraphs: list[str], code: list[str]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " + " ".join(rng.sample(paragraphs, 6))},
        {"role": "user", "content": f"Task {index}: fix the failing test. " + rng.choice(paragraphs)},
    ]
    for step in range(STEPS_PER_TRAJECTORY):
        call_id = f"call_{index}_{step}"
        messages.append(
            {
                "role": "assistant",
                "content": rng.choice(paragraphs),
                "reasoning_content": rng.choice(paragraphs),
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "terminal", "arguments": json.dumps({"command": f"cat src/m{step}.py"})},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": rng.choice(code)})
    messages.append({"role": "assistant", "content": f"Fixed. The answer is {index % 7}."})
    return {"messages": messages, "answer": str(index % 7), "task_id": index}


def generate(path: Path, count: int) -> int:
    rng = random.Random(count)
    paragraphs, code = _pool(rng)
    with path.open("w", encoding="utf-8") as out:
        for index in range(count):
            out.write(json.dumps(trajectory(index, rng, paragraphs, code)) + "\n")
    return path.stat().st_size


# --- the service under test ---


@dataclass
class Service:
    process: subprocess.Popen
    base_url: str
    peak_rss: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample_rss(self) -> None:
        probe = psutil.Process(self.process.pid)
        while not self._stop.is_set():
            try:
                self.peak_rss = max(self.peak_rss, probe.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.02)

    def reset_peak(self) -> None:
        self.peak_rss = psutil.Process(self.process.pid).memory_info().rss


def start_service(
    data_dir: Path, extra_environment: dict[str, str] | None = None, log_path: Path | None = None
) -> Service:
    """`extra_environment` is added after the secrets of this shell are removed; the log goes to `log_path`."""
    port = free_ports(1)[0]
    environment = {**os.environ, "RLCTL_DATA_DIR": str(data_dir), "RLCTL_DATASET_UPLOAD_MAX_BYTES": str(8 << 30)}
    for secret in ("OPENROUTER_API_KEY", "RLCTL_SUMMARY_BASE_URL", "RLCTL_API_TOKEN"):
        environment.pop(secret, None)
    environment.update(extra_environment or {})
    log = log_path.open("wb") if log_path is not None else subprocess.DEVNULL
    process = subprocess.Popen(
        [sys.executable, "-m", "rlctl.service.cli", "serve", "--port", str(port)],
        cwd=REPO_ROOT,
        env=environment,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    service = Service(process, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{service.base_url}/readyz", timeout=2).status_code == 200:
                threading.Thread(target=service.sample_rss, daemon=True).start()
                return service
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise RuntimeError("the service exited during start-up")
        time.sleep(0.2)
    raise RuntimeError("the service did not become ready")


def stop_service(service: Service) -> None:
    service._stop.set()
    if service.process.poll() is None:
        service.process.send_signal(signal.SIGTERM)
        try:
            service.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            service.process.kill()
            service.process.wait()


def run_job(client: httpx.Client, response: httpx.Response) -> dict[str, Any]:
    response.raise_for_status()
    job_id = response.json()["id"]
    while True:
        job = client.get(f"/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            if job["status"] != "succeeded":
                raise RuntimeError(f"job {job_id} {job['status']}: {job['error']}")
            return job["result"]
        time.sleep(0.2)


def tokenise_once(records: Path) -> float:
    """Baseline: read, parse and count every turn of every record once."""
    counter = ApproximateTokenCounter()
    started = time.perf_counter()
    total = 0
    with records.open("rb") as handle:
        for line in handle:
            record = record_from_dict(json.loads(line))
            total += sum(counter.count(turn.value) for turn in record.turns)
    return time.perf_counter() - started


def measure(size: int, workdir: Path) -> dict[str, Any]:
    source = workdir / f"trajectories-{size}.jsonl"
    started = time.perf_counter()
    byte_size = generate(source, size)
    print(f"[{size}] generated {byte_size / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s", flush=True)
    data_dir = workdir / f"var-{size}"
    service = start_service(data_dir)
    figures: dict[str, Any] = {"records": size, "gigabytes": byte_size / 1e9}
    try:
        with httpx.Client(base_url=service.base_url, timeout=3600) as client:
            service.reset_peak()
            started = time.perf_counter()
            with source.open("rb") as body:
                uploaded = client.post("/datasets", params={"name": f"bench-{size}"}, content=body)
            uploaded.raise_for_status()
            figures["ingest"] = (time.perf_counter() - started, service.peak_rss)
            dataset = uploaded.json()
            stats = client.get(f"/datasets/{dataset['id']}/stats").json()["stats"]
            figures["tokens"] = stats["tokens"]["total"]
            figures["min_tokens"] = stats["tokens"]["min"]
            print(f"[{size}] ingested: {figures['ingest'][0]:.1f} s", flush=True)

            service.reset_peak()
            started = time.perf_counter()
            compressed = run_job(client, client.post(f"/datasets/{dataset['id']}/compress", json={}))
            figures["compress"] = (time.perf_counter() - started, service.peak_rss)
            figures["compression"] = compressed["report"]
            print(f"[{size}] compressed: {figures['compress'][0]:.1f} s", flush=True)

            service.reset_peak()
            started = time.perf_counter()
            rewards = {"rewards": [{"name": "correctness"}, {"name": "format"}]}
            run_job(client, client.post(f"/datasets/{dataset['id']}/score", json=rewards))
            figures["score"] = (time.perf_counter() - started, service.peak_rss)
            print(f"[{size}] scored: {figures['score'][0]:.1f} s", flush=True)
        stored = data_dir.resolve() / "datasets" / dataset["id"] / "records.jsonl"
        figures["tokenise_once_s"] = tokenise_once(stored)
    finally:
        stop_service(service)
    return figures


def report(results: list[dict[str, Any]]) -> None:
    print()
    print("records   GB    tokens/rec(min)  phase      seconds   records/s   Mtokens/s   peak RSS MiB")
    for figures in results:
        tokens = figures["tokens"]
        for phase in ("ingest", "compress", "score"):
            seconds, rss = figures[phase]
            print(
                f"{figures['records']:7d} {figures['gigabytes']:5.2f} {figures['min_tokens']:12,.0f}     "
                f"{phase:9s} {seconds:8.1f} {figures['records'] / seconds:11.1f} {tokens / seconds / 1e6:11.2f} "
                f"{rss / 2**20:12.0f}"
            )
        ratio = figures["compress"][0] / figures["tokenise_once_s"]
        print(
            f"{'':7s} baseline: tokenising every record once {figures['tokenise_once_s']:.1f} s "
            f"({tokens / figures['tokenise_once_s'] / 1e6:.2f} Mtokens/s); compress / tokenise-once = {ratio:.2f}"
        )
        compression = figures["compression"]
        print(
            f"{'':7s} compression: {compression['compressed']} of {compression['records']} compressed, overall ratio "
            f"{compression['overall_ratio']:.3f}, still over limit {compression['still_over_limit']}"
        )
    if len(results) > 1:
        small, large = results[0], results[-1]
        for phase in ("ingest", "compress", "score"):
            growth = large[phase][1] / small[phase][1]
            print(
                f"peak RSS {phase}: {small[phase][1] / 2**20:.0f} MiB at {small['records']} records, "
                f"{large[phase][1] / 2**20:.0f} MiB at {large['records']} records (× {growth:.2f})"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,5000", help="comma-separated record counts")
    parser.add_argument("--workdir", type=Path, default=None, help="where files go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the generated files and data dirs")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rlctl-bench-datasets-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        results = [measure(int(size), workdir) for size in args.sizes.split(",")]
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    report(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
