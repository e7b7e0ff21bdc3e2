"""Runs on a real two-node Ray cluster (docs/RAY.md): placement, queue, logs, stop, a lost node, a restart.

The cluster (tests/support/ray_cluster.py) has one logical CPU per node, and every run asks for one CPU, so two
runs fill it, one per node, and a third waits `queued`. The runs are real: the Atropos API, the trainer (local
backend, tiny model) and the echo environment, started by the node-side supervisor under Ray's job, reporting to
a control plane served on a loopback port. One test walks the whole story so the cluster and the runs' start-up
(minutes of CPU on 2 cores) are paid once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from ray.job_submission import JobSubmissionClient

from tests.runs.conftest import wait_for_status
from tests.support.live import free_port, live_service
from tests.support.ray_cluster import RayCluster, leftover_processes, start_cluster
from tests.support.reaper import process_alive
from tests.support.waiting import scaled, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()
    assert not leftover_processes(cluster.root), "processes of the Ray cluster outlived `ray stop`"


def start(client: httpx.Client, **body: Any) -> dict[str, Any]:
    response = client.post(
        "/runs", json={"environment": "echo", "backend": "local", "resources": {"cpus": 1, "memory_gb": 1}, **body}
    )
    assert response.status_code == 201, response.text
    return response.json()


def run_of(client: httpx.Client, run_id: str) -> dict[str, Any]:
    return client.get(f"/runs/{run_id}").json()


def node_of(jobs: JobSubmissionClient, run: dict[str, Any]) -> str:
    info = jobs.get_job_info(run["executor_handle"])
    assert info.driver_node_id, f"job {run['executor_handle']} has no node yet"
    return str(info.driver_node_id)


def followed_lines(client: httpx.Client, run_id: str, role: str, wanted: int) -> list[str]:
    """Lines streamed by `?follow=true` after the initial tail (tail=0): only what the node reports from now on."""
    lines: list[str] = []
    params: dict[str, Any] = {"tail": 0, "follow": "true"}
    with client.stream("GET", f"/runs/{run_id}/logs/{role}", params=params, timeout=scaled(120)) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.strip():
                lines.append(line)
            if len(lines) >= wanted:
                break
    return lines


def test_runs_on_two_ray_nodes(ray_cluster: RayCluster, run_settings: Callable[..., Any]) -> None:
    port = free_port()
    settings = run_settings(
        executor="ray",
        ray_address=ray_cluster.dashboard_url,
        ray_control_url=f"http://127.0.0.1:{port}",
        local_total_steps=100_000,  # the runs train until they are stopped or lost
        monitor_interval_s=0.5,
        ray_report_interval_s=0.5,
    )
    jobs = JobSubmissionClient(ray_cluster.dashboard_url)
    head, worker = ray_cluster.node_id(head=True), ray_cluster.node_id(head=False)
    with live_service(settings, port=port) as live, live.client() as client:
        first, second = start(client), start(client)
        third = start(client)
        # Two runs fill the cluster's two CPUs; the third waits, first in line.
        queued = run_of(client, third["id"])
        assert queued["status"] == "queued" and queued["queue_position"] == 1, queued
        for run in (first, second):
            wait_for_status(client, run["id"], {"running"}, timeout=scaled(240))
        runs = {run["id"]: run_of(client, run["id"]) for run in (first, second)}
        assert all(r["executor"] == "ray" and r["executor_handle"].startswith("rlctl-") for r in runs.values())
        placed = {node_of(jobs, run): run_id for run_id, run in runs.items()}
        assert set(placed) == {head, worker}, f"both runs on one node: {placed}"
        on_head, on_worker = placed[head], placed[worker]
        assert run_of(client, third["id"])["status"] == "queued"

        # Logs follow for a run on another node: new trainer lines arrive through the node's reports.
        assert len(followed_lines(client, on_head, "trainer", wanted=2)) == 2
        wait_until(
            lambda: client.get(f"/runs/{on_head}/metrics", params={"name": "reward/mean"}).json()["metrics"],
            timeout=scaled(180),
            message="metrics of the run on the head node",
        )

        # The second node dies as a machine would: its run fails node_lost with its log tail, nothing is left.
        lost_pids = [p["pid"] for p in runs[on_worker]["processes"]]
        ray_cluster.kill_worker_node()
        lost = wait_for_status(client, on_worker, {"failed"}, timeout=scaled(120))
        assert lost["failure"]["kind"] == "node_lost", lost["failure"]
        assert lost["failure"]["log_tail"], "no log tail in the node_lost failure"
        wait_until(lambda: not any(process_alive(pid) for pid in lost_pids), timeout=scaled(60), message="orphans")
        # The node-side supervisor itself exits once its last report is taken.
        wait_until(
            lambda: not leftover_processes(ray_cluster.node_data_dir("worker")),
            timeout=scaled(60),
            message="the lost node's supervisor exiting",
        )
        # One CPU is left, held by the head's run: the third run waits, queued or (admitted while Ray still counted
        # the dead node) for Ray to place it; it does not run.
        assert run_of(client, third["id"])["status"] in ("queued", "starting")

        # A stop goes through Ray; its processes are gone, and the queued run starts in the freed slot.
        started = time.monotonic()
        stopped = client.post(f"/runs/{on_head}/stop", params={"wait_s": scaled(120)}).json()
        assert stopped["status"] == "stopped", stopped.get("failure")
        assert time.monotonic() - started < scaled(90)
        assert not any(process_alive(p["pid"]) for p in stopped["processes"] if p["pid"])
        wait_until(  # Ray ends the job once the node-side supervisor has handed over its last report
            lambda: jobs.get_job_status(stopped["executor_handle"]).value in ("STOPPED", "SUCCEEDED"),
            timeout=scaled(60),
            message="Ray ending the stopped run's job",
        )
        wait_for_status(client, third["id"], {"running"}, timeout=scaled(240))
        assert node_of(jobs, run_of(client, third["id"])) == head

    # The control plane restarts; the run on Ray goes on and is re-attached by its submission id.
    step_before = run_of_db(settings, third["id"])
    with live_service(settings, port=port) as live, live.client() as client:
        wait_until(
            lambda: (run_of(client, third["id"])["last_step"] or 0) > (step_before or 0),
            timeout=scaled(120),
            message="training progress reported after the restart",
        )
        assert run_of(client, third["id"])["status"] == "running"
        stopped = client.post(f"/runs/{third['id']}/stop", params={"wait_s": scaled(120)}).json()
        assert stopped["status"] == "stopped", stopped.get("failure")
        assert not any(process_alive(p["pid"]) for p in stopped["processes"] if p["pid"])
    wait_until(
        lambda: not leftover_processes(ray_cluster.node_data_dir("head")),
        timeout=scaled(60),
        message="the head node's supervisors exiting",
    )


def run_of_db(settings: Any, run_id: str) -> int | None:
    from service.db.engine import Database
    from service.db.models import Run

    db = Database(settings.sqlalchemy_url)
    try:
        with db.session() as session:
            run = session.get(Run, run_id)
            return run.last_step if run else None
    finally:
        db.dispose()
