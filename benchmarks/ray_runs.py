"""Runs on Ray against runs on the local executor, in the same run of this script (docs/RAY.md).

    .venv/bin/python benchmarks/ray_runs.py [--runs 10] [--offline-steps 2] [--steps 4] [--starts 2] [--hold-s 20]
                                            [--only batch]

Each figure is measured on a real `rlctl serve` subprocess (loopback, SQLite) with real echo runs on the local
backend (the tiny model), against a real Ray cluster started here with the `ray` commands (one CPU per node,
tests/support/ray_cluster.py), and against the local executor:

1. POST /runs → `running`: seconds for `--starts` runs one after the other, on Ray and on the local executor.
2. `--runs` offline runs (docs/RUNS.md#training-on-a-dataset: the trainer on a stored, scored echo dataset, whose
   split travels to the node in the run's plan; `--offline-steps` steps each), all posted at once, on a two-node
   cluster and on a one-node cluster (one CPU per node, one CPU per run: the cluster runs two, resp. one, at a
   time and queues the rest): seconds until the last one completed, and the ratio. The load average is printed
   before and after: on a 2-core machine two nodes share the same two cores, so the speed-up is bounded by them.
3. The control plane's own cost per supervised run: its CPU seconds per second and its resident memory with no
   run, then while `--starts` runs train for `--hold-s` seconds; the difference divided by the number of runs,
   on each executor. (The runs' own processes are not the control plane's: on Ray they are the node's.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from tests.support.live import free_port  # noqa: E402
from tests.support.ray_cluster import RayCluster, start_cluster  # noqa: E402

TERMINAL = {"completed", "stopped", "failed"}


@contextmanager
def control_plane(
    workdir: Path, executor: str, cluster: RayCluster | None, steps: int
) -> Iterator[tuple[httpx.Client, psutil.Process]]:
    port = free_port()
    data_dir = workdir / f"var-{executor}-{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLCTL_")}
    env.update(
        {
            "RLCTL_DATA_DIR": str(data_dir),
            "RLCTL_EXECUTOR": executor,
            "RLCTL_LOCAL_TOTAL_STEPS": str(steps),
            "RLCTL_LOCAL_SAVE_CHECKPOINT_INTERVAL": str(max(1, steps)),
            "RLCTL_STOP_GRACE_S": "5",
            "RLCTL_MONITOR_INTERVAL_S": "0.5",
            "RLCTL_RAY_REPORT_INTERVAL_S": "0.5",
        }
    )
    if cluster is not None:
        env["RLCTL_RAY_ADDRESS"] = cluster.dashboard_url
        env["RLCTL_RAY_CONTROL_URL"] = f"http://127.0.0.1:{port}"
    subprocess.run([sys.executable, "-m", "rlctl.service.cli", "db", "upgrade"], env=env, cwd=REPO_ROOT, check=True)
    log = (workdir / f"serve-{executor}-{port}.log").open("ab")
    popen = subprocess.Popen(
        [sys.executable, "-m", "rlctl.service.cli", "serve", "--port", str(port)],
        env=env,
        cwd=REPO_ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if client.get("/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or popen.poll() is not None:
                raise SystemExit(f"the {executor} control plane did not start; see {log.name}")
            time.sleep(0.5)
        yield client, psutil.Process(popen.pid)
    finally:
        for run in client.get("/runs", params={"limit": 100}).json().get("runs", []):
            if run["status"] not in TERMINAL:
                client.post(f"/runs/{run['id']}/stop", params={"wait_s": 60})
        client.close()
        popen.terminate()
        popen.wait(60)
        log.close()


def post_run(client: httpx.Client) -> str:
    body = {"environment": "echo", "backend": "local", "resources": {"cpus": 1, "memory_gb": 1}}
    response = client.post("/runs", json=body)
    response.raise_for_status()
    return str(response.json()["id"])


def wait_status(client: httpx.Client, run_id: str, wanted: set[str], timeout_s: float = 900) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = client.get(f"/runs/{run_id}").json()
        if run["status"] in wanted | TERMINAL:
            if run["status"] not in wanted:
                raise SystemExit(f"run {run_id} ended {run['status']}: {run.get('failure')}")
            return dict(run)
        time.sleep(0.2)
    raise SystemExit(f"run {run_id} did not reach {wanted} within {timeout_s:g} s")


def start_latency(client: httpx.Client, starts: int) -> list[float]:
    seconds = []
    for _ in range(starts):
        started = time.monotonic()
        run_id = post_run(client)
        wait_status(client, run_id, {"running", "completed"})
        seconds.append(time.monotonic() - started)
        client.post(f"/runs/{run_id}/stop", params={"wait_s": 60})
    return seconds


def scored_dataset(client: httpx.Client, groups: int) -> str:
    """An echo dataset of `groups` prompts with four stored replies each (the first echoes), scored."""
    lines = []
    for group in range(groups):
        digits = str(1000 + 37 * group)
        for reply in range(4):
            text = digits if reply == 0 else "x" * (reply + 1)
            conversation = [{"from": "human", "value": f"Echo: {digits}"}, {"from": "gpt", "value": text}]
            lines.append(json.dumps({"conversations": conversation, "answer": digits}))
    uploaded = client.post("/datasets", params={"name": "bench", "format": "sharegpt"}, content="\n".join(lines))
    uploaded.raise_for_status()
    job = client.post(f"/datasets/{uploaded.json()['id']}/score", json={"rewards": [{"name": "correctness"}]})
    job.raise_for_status()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        state = client.get(f"/jobs/{job.json()['id']}").json()
        if state["status"] == "succeeded":
            return str(state["result"]["dataset_id"])
        if state["status"] in ("failed", "cancelled"):
            raise SystemExit(f"scoring the benchmark dataset {state['status']}: {state.get('error')}")
        time.sleep(0.2)
    raise SystemExit("scoring the benchmark dataset took over 300 s")


def post_offline_run(client: httpx.Client, dataset_id: str) -> str:
    body = {
        "dataset": {"id": dataset_id, "mode": "offline", "held_out": 0},
        "config": {"group_size": 4, "batch_size": 8, "epochs": 1},
        "backend": "local",
        "resources": {"cpus": 1, "memory_gb": 1},
    }
    response = client.post("/runs", json=body)
    response.raise_for_status()
    return str(response.json()["id"])


def batch(client: httpx.Client, runs: int, steps: int) -> float:
    """Seconds from posting `runs` offline runs of `steps` steps at once until the last one completed."""
    dataset_id = scored_dataset(client, groups=2 * steps)  # 2 groups of 4 replies fill one batch of 8: one step
    started = time.monotonic()
    ids = [post_offline_run(client, dataset_id) for _ in range(runs)]
    for index, run_id in enumerate(ids, 1):
        run = wait_status(client, run_id, {"completed"}, timeout_s=3600)
        assert run["last_step"] == steps, run
        print(f"  run {index}/{runs} completed at {time.monotonic() - started:.0f} s; load {os.getloadavg()[0]:.1f}")
    return time.monotonic() - started


def cost_per_run(client: httpx.Client, service: psutil.Process, runs: int, hold_s: float) -> tuple[float, float]:
    """(CPU seconds per second, MB of resident memory) the control plane adds per supervised run."""

    def sample(seconds: float) -> tuple[float, float]:
        before = service.cpu_times()
        time.sleep(seconds)
        after = service.cpu_times()
        cpu = (after.user + after.system - before.user - before.system) / seconds
        return cpu, service.memory_info().rss / 1e6

    idle_cpu, idle_rss = sample(hold_s)
    ids = [post_run(client) for _ in range(runs)]
    for run_id in ids:
        wait_status(client, run_id, {"running"})
    busy_cpu, busy_rss = sample(hold_s)
    for run_id in ids:
        client.post(f"/runs/{run_id}/stop", params={"wait_s": 60})
    return (busy_cpu - idle_cpu) / runs, (busy_rss - idle_rss) / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--starts", type=int, default=2)
    parser.add_argument("--hold-s", type=float, default=20)
    parser.add_argument("--offline-steps", type=int, default=2, help="steps of each offline run")
    parser.add_argument("--only", choices=["batch"], help="only the offline-runs figure")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rlctl-ray-bench-"))
    print(f"load before: {os.getloadavg()}")
    try:
        local_starts, ray_starts = [], []
        two = start_cluster(nodes=2)
        try:
            with control_plane(workdir, "ray", two, args.steps) as (client, service):
                if not args.only:
                    ray_starts = start_latency(client, args.starts)
                    ray_cost = cost_per_run(client, service, args.starts, args.hold_s)
                print(f"load before the two-node batch: {os.getloadavg()}", flush=True)
                two_nodes = batch(client, args.runs, args.offline_steps)
                print(f"two nodes: {two_nodes:.0f} s; load {os.getloadavg()}", flush=True)
        finally:
            two.stop()
        one = start_cluster(nodes=1)
        try:
            with control_plane(workdir, "ray", one, args.steps) as (client, _service):
                print(f"load before the one-node batch: {os.getloadavg()}", flush=True)
                one_node = batch(client, args.runs, args.offline_steps)
                print(f"one node: {one_node:.0f} s; load {os.getloadavg()}", flush=True)
        finally:
            one.stop()
        if not args.only:
            with control_plane(workdir, "local", None, args.steps) as (client, service):
                local_starts = start_latency(client, args.starts)
                local_cost = cost_per_run(client, service, args.starts, args.hold_s)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    print(f"load after: {os.getloadavg()}")
    print(
        f"{args.runs} offline runs of {args.offline_steps} steps: two nodes {two_nodes:.0f} s, one node "
        f"{one_node:.0f} s, speed-up {one_node / two_nodes:.2f}x"
    )
    if args.only:
        return
    print(
        f"POST -> running, s (mean of {args.starts}): ray {mean(ray_starts):.1f} {ray_starts}, "
        f"local {mean(local_starts):.1f} {local_starts}, ratio ray/local {mean(ray_starts) / mean(local_starts):.2f}"
    )
    print(
        f"control plane per supervised run: ray {ray_cost[0] * 100:.2f}% of a core, {ray_cost[1]:.1f} MB; "
        f"local {local_cost[0] * 100:.2f}% of a core, {local_cost[1]:.1f} MB"
    )


if __name__ == "__main__":
    main()
