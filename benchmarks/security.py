"""The service under attack: /healthz latency while hostile inputs are processed, peak memory under the largest
uploads, escape attempts against the terminal sandbox, and secrets found anywhere after a hostile collection.

    .venv/bin/python benchmarks/security.py [--rounds 6] [--huge-mb 200] [--escapes-only]

A real `rlctl serve` process (SQLite, a fresh data dir, secrets configured) gets, over HTTP:
  1. baseline: /healthz, sequentially, with nothing else to do (p50, p99, max);
  2. hostile uploads: `--rounds` uploads of 1 MB of repeated `<tool_call>` (and `<think>`, `<tools>`) in a record,
     while /healthz is polled; the ratio of its p99 to the baseline's, measured in the same run;
  3. hostile model replies: a collection against a scripted model on loopback whose every reply is 390 KB of
     `<tool_call>` (just under the reply cap, so it is parsed), /healthz polled meanwhile;
  4. peak RSS (sampled every 20 ms) over: an upload of four items of the largest accepted size (16 MiB each),
     and one JSON Lines line of `--huge-mb` MB (refused with 413 after its first 16 MiB);
  5. a collection whose model tries every escape of docs/SECURITY.md through the terminal and file tools (system
     calls the seccomp filter blocks, new namespaces, memory and /tmp exhaustion included), then
     a count of the configured secrets in the data directory, the service's log and every answer (goal: 0).
Escape attempts are counted by kind, each with the check that decides it was blocked.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.datasets import Service, start_service, stop_service  # noqa: E402
from rlctl.sandbox.seccomp import ARCHES, native_arch  # noqa: E402
from tests.datasets_api.chat_server import chat_server  # noqa: E402

SECRETS = {
    "OPENROUTER_API_KEY": "sk-or-bench-secret-5150",
    "RLCTL_COLLECTION_API_KEY": "sk-coll-bench-secret-8086",
    "WANDB_API_KEY": "wandb-bench-secret-6502",
}
MEGABYTE = 1 << 20


def record_with(content: str, system: str = "You are helpful.") -> bytes:
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": content},
    ]
    return json.dumps({"messages": messages}).encode() + b"\n"


def hostile_uploads() -> list[bytes]:
    return [
        record_with("<tool_call>" * (MEGABYTE // 11)),
        record_with("<think>" * (MEGABYTE // 7)),
        record_with("ok", system="<tools>" * (MEGABYTE // 7)),
        record_with("<tool_response>" * (MEGABYTE // 15)),
    ]


def percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies) or [float("nan")]
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {"n": len(latencies), "p50_ms": statistics.median(ordered) * 1000, "p99_ms": p99 * 1000,
            "max_ms": ordered[-1] * 1000}  # fmt: skip


def poll_health(base_url: str, until: threading.Event, latencies: list[float]) -> None:
    with httpx.Client(base_url=base_url, timeout=120) as client:
        while not until.is_set():
            started = time.perf_counter()
            client.get("/healthz").raise_for_status()
            latencies.append(time.perf_counter() - started)


def while_polling(base_url: str, work: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    latencies: list[float] = []
    done = threading.Event()
    poller = threading.Thread(target=poll_health, args=(base_url, done, latencies), daemon=True)
    poller.start()
    try:
        result = work()
    finally:
        done.set()
        poller.join(timeout=180)
    return result, percentiles(latencies)


def baseline(base_url: str, count: int = 300) -> dict[str, float]:
    latencies = []
    with httpx.Client(base_url=base_url, timeout=30) as client:
        for _ in range(count):
            started = time.perf_counter()
            client.get("/healthz").raise_for_status()
            latencies.append(time.perf_counter() - started)
    return percentiles(latencies)


def upload_rounds(base_url: str, rounds: int) -> dict[str, Any]:
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=base_url, timeout=600) as client:
        for index in range(rounds):
            for body in hostile_uploads():
                status = client.post("/datasets", params={"name": f"hostile-{index}"}, content=body).status_code
                statuses[status] = statuses.get(status, 0) + 1
    return statuses


def hostile_replies(base_url: str, items: int) -> dict[str, Any]:
    flood = "<tool_call>" * (390_000 // 11)

    def model(_body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, {"content": flood}

    with chat_server(model) as server, httpx.Client(base_url=base_url, timeout=60) as client:
        body = {"name": "flood", "prompts": [{"prompt": f"p{i}"} for i in range(items // 2)],
                "base_url": server.base_url, "model": "flood", "max_turns": 3, "concurrency": 4,
                "discard_without_reasoning": False}  # fmt: skip
        collection = client.post("/collections", json=body).json()
        return wait_collection(client, collection["id"])


def wait_collection(client: httpx.Client, collection_id: str, timeout: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = client.get(f"/collections/{collection_id}").json()
        if found["status"] in ("completed", "failed", "cancelled"):
            return found
        time.sleep(0.2)
    raise TimeoutError(f"collection {collection_id} did not end")


def big_upload(path: Path, item_bytes: int, count: int) -> None:
    padding = "x" * (item_bytes - 400)
    with path.open("wb") as handle:
        for _ in range(count):
            handle.write(record_with(padding))


def streamed(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(MEGABYTE):
            yield chunk


def peak_rss_of_upload(service: Service, path: Path, name: str) -> dict[str, Any]:
    service.reset_peak()
    before = service.peak_rss
    with httpx.Client(base_url=service.base_url, timeout=600) as client:
        answer = client.post("/datasets", params={"name": name}, content=streamed(path))
    return {"status": answer.status_code, "upload_mb": path.stat().st_size / MEGABYTE,
            "rss_before_mb": before / MEGABYTE, "peak_rss_mb": service.peak_rss / MEGABYTE}  # fmt: skip


# --- escapes and secrets ---

_NUMBERS = (native_arch() or ARCHES["x86_64"]).numbers
# Blocked system calls, made directly: each prints "-1 1" (failed, EPERM) where the seccomp filter answers.
KERNEL_CALLS = (
    "import ctypes; c = ctypes.CDLL(None, use_errno=True); "
    "[print(c.syscall(n, 0, 0, 0, 0, 0), ctypes.get_errno()) for n in "
    f"({_NUMBERS['ptrace']}, {_NUMBERS['keyctl']}, {_NUMBERS['bpf']}, {_NUMBERS['perf_event_open']})]"
)
SOCKETS = (
    'import socket\nfor f, t in ((40, 1), (16, 3), (17, 3)):\n    try: socket.socket(f, t); print("made")\n'
    '    except OSError: print("refused")'
)  # AF_VSOCK, AF_NETLINK, AF_PACKET
ESCAPES: list[tuple[str, str, Callable[[dict[str, Any], Path], bool]]] = [
    # (kind, terminal command, "blocked" judged on the tool's result and the host's data dir)
    ("read the service's secrets", "cat /proc/*/environ 2>&1 | tr '\\0' '\\n'; env",
     lambda result, _data: not any(s in result["output"] for s in SECRETS.values())),
    ("see the service's processes", "ls /proc | grep -cE '^[0-9]+$'",
     lambda result, _data: int(result["output"].strip() or 0) < 10),
    ("reach the network", "for to in 127.0.0.1/22 1.1.1.1/443; do (exec 3<>/dev/tcp/$to && echo CONNECTED); done",
     lambda result, _data: "CONNECTED" not in result["output"]),
    ("write outside the work directory", "DATA; touch \"$D/escaped\" /tmp/../escaped /usr/escaped 2>&1; true",
     lambda _result, data: not (data / "escaped").exists() and not Path("/usr/escaped").exists()),
    ("read the service's files", "DATA; cat \"$D/rlctl.db\" 2>&1 | head -c 200",
     lambda result, _data: "SQLite format" not in result["output"]),
    ("leave a process behind", "setsid sh -c 'exec -a rlctl-bench-survivor sleep 900' </dev/null >/dev/null 2>&1 &",
     lambda _result, _data: not _survivors("rlctl-bench-survivor")),
    ("fork bomb", "b() { b | b & }; b; sleep 3; echo done",
     lambda result, _data: "Resource temporarily unavailable" in result["output"]),
    ("make a new namespace", "unshare -U true 2>&1; unshare -n true 2>&1; unshare -m true 2>&1; true",
     lambda result, _data: result["output"].count("unshare failed") == 3),
    ("call a kernel surface (ptrace, keyctl, bpf, perf)", f"python3 -c '{KERNEL_CALLS}'",
     lambda result, _data: result["output"].split() == ["-1", "1"] * 4),
    ("exhaust the memory", "python3 -c 'b = bytearray(1536 << 20); print(len(b))' 2>&1",
     lambda result, _data: "memory limit" in result.get("error", "") or "MemoryError" in result["output"]),
    ("fill /tmp (memory)", "for i in 1 2 3 4 5 6 7 8; do head -c 60000000 /dev/zero > /tmp/f$i || break; done "
     "2>/dev/null; du -sb /tmp | cut -f1",
     lambda result, _data: int(result["output"].split()[-1]) <= 256 << 20),
    ("hard-link a file out", "DATA; ln \"$D/rlctl.db\" hard 2>&1; ln -s \"$D/rlctl.db\" soft; ln -s / root",
     lambda result, _data: "No such file" in result["output"]),  # the symbolic links: the file tools, below
    ("open a vsock, netlink or packet socket", f"python3 -c '{SOCKETS}'",
     lambda result, _data: result["output"].split() == ["refused"] * 3),
    ("fill the work directory while the call runs", "for i in 1 2 3 4 5 6; do head -c 60000000 /dev/zero > w$i "
     "|| break; done 2>/dev/null; df -B1 --output=used . | tail -1; rm -f w*",
     lambda result, _data: int(result["output"].split()[-1]) <= 256 << 20),
    ("hide bytes below a path longer than PATH_MAX", "n=$(printf 'd%.0s' $(seq 200)); for i in $(seq 40); do "
     "mkdir $n && cd $n; done; for i in 1 2 3 4 5 6; do head -c 60000000 /dev/zero > w$i || break; done "
     "2>/dev/null; df -B1 --output=used /work | tail -1; cd /work && rm -rf d*",
     lambda result, _data: int(result["output"].split()[-1]) <= 256 << 20),
    ("exhaust the work directory's inodes", "cd /work; mkdir many && cd many; i=0; while : > f$i; do i=$((i+1)); "
     "done 2>/dev/null; echo $i; cd /work && rm -rf many",
     lambda result, _data: int(result["output"].split()[-1]) <= 16_384),
    ("a 1,500-deep directory that fails the clean-up", "mkdir -p $(printf 'd/%.0s' $(seq 1500)) && echo made",
     lambda result, data: "made" in result["output"]
     and not any(any(p.iterdir()) for p in data.glob("collections/*/sandboxes") if p.is_dir())),
]  # fmt: skip
# Destinations that carry a private or metadata IPv4 address in an IPv6 one: each must be refused at creation.
EMBEDDED_IPV4 = ["[64:ff9b::7f00:1]:80", "[::a9fe:a9fe]:80", "[2002:a00:1::1]:80", "[64:ff9b:1::a9fe:a9fe]:80"]
FILE_ESCAPES = ["soft", "root/etc/passwd", "../../../rlctl.db", "/etc/passwd"]


def _survivors(marker: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(entry.name)
        except OSError:
            continue
    return found


def escape_collection(service: Service, data_dir: Path) -> tuple[dict[str, list[int]], str]:
    commands = [command.replace("DATA;", f"D={data_dir};") for _, command, _ in ESCAPES]

    def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}

    def model(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        turn = sum(1 for message in body["messages"] if message["role"] == "assistant")
        if turn == 0:
            return 200, {"content": "", "tool_calls": [call(f"t{i}", "terminal", {"command": c})
                                                       for i, c in enumerate(commands)]}  # fmt: skip
        if turn == 1:
            writes = [call(f"w{i}", "write_file", {"path": p, "content": "x"}) for i, p in enumerate(FILE_ESCAPES)]
            reads = [call(f"r{i}", "read_file", {"path": p}) for i, p in enumerate(FILE_ESCAPES)]
            return 200, {"content": "", "tool_calls": writes + reads}
        return 200, {"content": f"I was told {SECRETS['OPENROUTER_API_KEY']}"}

    counts: dict[str, list[int]] = {}
    with chat_server(model) as server, httpx.Client(base_url=service.base_url, timeout=60) as client:
        body = {"name": "escape", "prompts": [{"prompt": "escape"}], "base_url": server.base_url, "model": "m",
                "tools": ["terminal", "read_file", "write_file"], "max_turns": 3, "tool_timeout_s": 10,
                "discard_without_reasoning": False}  # fmt: skip
        created = client.post("/collections", json=body)
        if created.status_code != 202:
            return {"sandbox unavailable (collection refused)": [0, 1]}, created.text
        collection = wait_collection(client, created.json()["id"])
        records = client.get(f"/datasets/{collection['dataset_id']}/records").json()["records"]
        answered = json.dumps(collection) + json.dumps(records)
        for destination in EMBEDDED_IPV4:
            refused = client.post("/collections", json={**body, "network": [destination]})
            tried = counts.setdefault("name an IPv6 destination carrying a private IPv4 one", [0, 0])
            tried[0], tried[1] = tried[0] + 1, tried[1] + int(refused.status_code == 422)
    results = [_tool_result(turn["value"]) for turn in records[0]["conversations"] if turn.get("name")]
    for (kind, _, blocked), result in zip(ESCAPES, results[: len(ESCAPES)], strict=True):
        tried, stopped = counts.setdefault(kind, [0, 0]), blocked(result, data_dir)
        tried[0], tried[1] = tried[0] + 1, tried[1] + int(stopped)
    for result in results[len(ESCAPES) :]:
        tried = counts.setdefault("file tool through a link or out of the directory", [0, 0])
        tried[0], tried[1] = tried[0] + 1, tried[1] + int("outside the working directory" in result.get("error", ""))
    return counts, answered


def _tool_result(value: str) -> dict[str, Any]:
    body = value.split("<tool_response>", 1)[1].rsplit("</tool_response>", 1)[0]
    return json.loads(json.loads(body)["content"])


def secrets_found(data_dir: Path, log_path: Path, answered: str) -> dict[str, int]:
    found = {"data directory": 0, "service log": 0, "responses": 0}
    for secret in SECRETS.values():
        for path in data_dir.rglob("*"):
            if path.is_file() and not path.is_symlink():
                found["data directory"] += path.read_bytes().count(secret.encode())
        found["service log"] += log_path.read_text(errors="replace").count(secret)
        found["responses"] += answered.count(secret)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="rounds of the four 1 MB hostile uploads")
    parser.add_argument("--huge-mb", type=int, default=200, help="size of the one-line upload that must be refused")
    parser.add_argument("--items", type=int, default=8, help="items of the hostile-reply collection")
    parser.add_argument("--escapes-only", action="store_true", help="only the escape collection and the secrets")
    arguments = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rlctl-security-bench-"))
    data_dir, log_path = workdir / "var", workdir / "service.log"
    service = start_service(data_dir, extra_environment=SECRETS, log_path=log_path)
    try:
        figures = {} if arguments.escapes_only else hostile_input_figures(service, workdir, arguments)
        escapes, answered = escape_collection(service, data_dir)
    finally:
        stop_service(service)
    figures["secrets found"] = secrets_found(data_dir, log_path, answered)
    report(figures, escapes)
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def hostile_input_figures(service: Service, workdir: Path, arguments: argparse.Namespace) -> dict[str, Any]:
    """/healthz under hostile uploads and replies, and peak RSS under the largest uploads (items 1 to 4)."""
    figures: dict[str, Any] = {"healthz idle": baseline(service.base_url)}
    statuses, figures["healthz during 1 MB hostile uploads"] = while_polling(
        service.base_url, lambda: upload_rounds(service.base_url, arguments.rounds)
    )
    figures["hostile upload answers"] = statuses
    collection, figures["healthz during 390 KB hostile replies"] = while_polling(
        service.base_url, lambda: hostile_replies(service.base_url, arguments.items)
    )
    figures["hostile reply collection"] = {"status": collection["status"], **collection["progress"]}
    largest = workdir / "largest.jsonl"
    big_upload(largest, 16 * MEGABYTE - 1, 4)
    figures["4 items of 16 MiB (accepted)"] = peak_rss_of_upload(service, largest, "largest")
    largest.unlink()
    huge = workdir / "huge.jsonl"
    big_upload(huge, arguments.huge_mb * MEGABYTE, 1)
    figures[f"one {arguments.huge_mb} MB line (refused)"] = peak_rss_of_upload(service, huge, "huge")
    huge.unlink()
    return figures


def report(figures: dict[str, Any], escapes: dict[str, list[int]]) -> None:
    idle = figures.get("healthz idle", {}).get("p99_ms")
    for name, values in figures.items():
        if isinstance(values, dict) and "p99_ms" in values:
            ratio = values["p99_ms"] / idle if idle else float("nan")
            print(f"{name:42s} n={values['n']:5d}  p50 {values['p50_ms']:8.1f} ms  p99 {values['p99_ms']:8.1f} ms  "
                  f"max {values['max_ms']:8.1f} ms  p99/idle {ratio:6.1f}x")  # fmt: skip
        else:
            print(f"{name:42s} {json.dumps(values)}")
    print("escape attempts (blocked / tried):")
    for kind, (tried, blocked) in escapes.items():
        print(f"  {kind:50s} {blocked}/{tried}")


if __name__ == "__main__":
    raise SystemExit(main())
