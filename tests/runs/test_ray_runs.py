"""Runs on a real two-node Ray cluster (docs/RAY.md): GPUs, a stop during start-up, placement, queue, logs, a lost
node, a restart, a stop.

The cluster (tests/support/ray_cluster.py) has one logical CPU per node, and every run asks for one CPU, so two
runs fill it, one per node, and a third waits `queued`. The second node also has one logical GPU (`ray start
--num-gpus=1`, no GPU needed): Ray assigns it to a job that asks, and sets CUDA_VISIBLE_DEVICES for it. The runs
are real: the Atropos API, the trainer (local backend, tiny model) and the echo environment, started by the
node-side supervisor under Ray's job, reporting to a control plane served on a loopback port.

The cluster and the runs' start-up cost minutes of CPU on 2 cores, so one test walks the story on one cluster, in
two parts: a control plane on SQLite (a GPU run, stopped during its start-up), then one on PostgreSQL when it is
configured (the CI), else SQLite again, for the rest. (Two test functions would share the session's cluster only
on one pytest-xdist worker; `make test` may hand them to two, each starting a cluster of its own.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from ray.job_submission import JobSubmissionClient

from rlctl.service.settings import Settings
from tests.conftest import build_settings
from tests.runs.conftest import FAST_LOCAL, wait_for_status
from tests.support.databases import MigratedDatabases, fresh_database
from tests.support.live import free_port, live_service
from tests.support.ray_cluster import RayCluster, leftover_processes, start_cluster
from tests.support.reaper import process_alive, stop_run_processes
from tests.support.waiting import scaled, wait_until

pytestmark = pytest.mark.e2e

CPU_RUN = {"cpus": 1, "memory_gb": 1, "gpus": 0}
# Its environment never registers: a run of it stays `starting` until stopped (a start takes under a second).
STUCK = "never_registers"
STUCK_DIR = Path(__file__).resolve().parents[1] / "support" / "environments"


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    cluster = start_cluster(worker_gpus=1)
    try:
        yield cluster
    finally:
        cluster.stop()
    assert not leftover_processes(cluster.root, by_environment=True), "processes of the Ray cluster outlived it"


@pytest.fixture
def sqlite_url(tmp_path: Path, session_databases: MigratedDatabases) -> Iterator[str]:
    (tmp_path / "sqlite").mkdir()
    with fresh_database("sqlite", tmp_path / "sqlite", session_databases) as url:
        yield url
        stopped = stop_run_processes(url)
        assert not stopped, f"processes of runs were left running: {stopped}"


def ray_settings(make: Callable[..., Settings], cluster: RayCluster, port: int) -> Settings:
    return make(
        executor="ray",
        ray_address=cluster.dashboard_url,
        ray_control_url=f"http://127.0.0.1:{port}",
        local_total_steps=100_000,  # the runs train until they are stopped or lost
        monitor_interval_s=0.5,
        ray_report_interval_s=0.5,
        environment_dirs=str(STUCK_DIR),
    )


def start(client: httpx.Client, resources: dict[str, Any] | None = None, environment: str = "echo") -> dict[str, Any]:
    body = {"environment": environment, "backend": "local", "resources": resources or CPU_RUN}
    response = client.post("/runs", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def run_of(client: httpx.Client, run_id: str) -> dict[str, Any]:
    return client.get(f"/runs/{run_id}").json()


def node_of(jobs: JobSubmissionClient, run: dict[str, Any]) -> str:
    info = jobs.get_job_info(run["executor_handle"])
    assert info.driver_node_id, f"job {run['executor_handle']} has no node yet"
    return str(info.driver_node_id)


def pid_of(run: dict[str, Any], role: str) -> int | None:
    return next((p["pid"] for p in run["processes"] if p["role"] == role and p["pid"]), None)


def visible_devices(pid: int) -> str | None:
    """CUDA_VISIBLE_DEVICES as that process has it."""
    return psutil.Process(pid).environ().get("CUDA_VISIBLE_DEVICES")


def trainer_started(client: httpx.Client, run_id: str) -> dict[str, Any]:
    """The run once its trainer process is reported started, while the run is still starting."""

    def started() -> dict[str, Any] | None:
        run = run_of(client, run_id)
        return run if pid_of(run, "trainer") or run["status"] not in ("pending", "starting") else None

    run = wait_until(started, timeout=240, interval=0.2, message=f"run {run_id}'s trainer starting")
    assert run["status"] == "starting", f"run {run_id} {run['status']} before its trainer was seen: {run['failure']}"
    return run


def stopped_during_start_up(client: httpx.Client, jobs: JobSubmissionClient, run_id: str) -> dict[str, Any]:
    """Stop a starting run; it ends `stopped` without ever running, every process it started is gone, and Ray ends
    its job. (The environment may have started: it is spawned beside the API, docs/RUNS.md#process-order.)"""
    answer = client.post(f"/runs/{run_id}/stop", params={"wait_s": scaled(120)}).json()
    assert answer["status"] == "stopped" and answer["failure"] is None, (answer["status"], answer["failure"])
    started = [p for p in answer["processes"] if p["pid"]]
    assert answer["started_at"] is None, "the run reached running although its start-up was stopped"
    assert not any(process_alive(p["pid"]) for p in started), answer["processes"]
    wait_until(
        lambda: jobs.get_job_status(answer["executor_handle"]).value in ("STOPPED", "SUCCEEDED"),
        timeout=60,
        message="Ray ending the stopped run's job",
    )
    return answer


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


def test_runs_on_two_ray_nodes(
    ray_cluster: RayCluster, run_settings: Callable[..., Any], sqlite_url: str, tmp_path: Path
) -> None:
    jobs = JobSubmissionClient(ray_cluster.dashboard_url)
    head, worker = ray_cluster.node_id(head=True), ray_cluster.node_id(head=False)

    port = free_port()
    on_sqlite = ray_settings(
        lambda **values: build_settings(tmp_path / "var-sqlite", sqlite_url, **{**FAST_LOCAL, **values}),
        ray_cluster,
        port,
    )
    with live_service(on_sqlite, port=port) as live, live.client() as client:
        gpu_run_stopped_during_start_up(client, jobs, ray_cluster, head, worker)

    port = free_port()
    settings = ray_settings(run_settings, ray_cluster, port)  # PostgreSQL when configured
    assert settings.sqlalchemy_url != on_sqlite.sqlalchemy_url
    with live_service(settings, port=port) as live, live.client() as client:
        on_head = spread_queue_logs_and_a_lost_node(client, jobs, ray_cluster, head, worker)
    restart_re_attaches_then_a_stop(settings, port, jobs, ray_cluster, on_head)


def gpu_run_stopped_during_start_up(
    client: httpx.Client, jobs: JobSubmissionClient, cluster: RayCluster, head: str, worker: str
) -> None:
    """A local-backend run on a cluster with a GPU asks for one by default; Ray places it on the GPU node and its
    trainer sees the GPU Ray assigned. A run Ray cannot place yet is cancelled by a stop before any process of it
    starts; the GPU run, stopped while its trainer starts, is cancelled on its node."""
    gpu_run = start(client, {"cpus": 0.5, "memory_gb": 2}, environment=STUCK)
    assert gpu_run["resources"]["gpus"] == 1, gpu_run["resources"]
    assert placed(jobs, client, gpu_run["id"]) == worker, "the GPU run is not on the only node with a GPU"
    # Half of each node's CPU taken, two thirds of its memory: a run asking for one CPU fits the cluster's total
    # (admitted, `starting`) but no node, so Ray holds its job pending; a stop cancels it there.
    beside = start(client, {"cpus": 0.5, "memory_gb": 2, "gpus": 0})
    assert placed(jobs, client, beside["id"]) == head
    unplaced = start(client, {"cpus": 1, "memory_gb": 1, "gpus": 0})
    handle = wait_until(lambda: run_of(client, unplaced["id"])["executor_handle"], timeout=60, message="submitted")
    assert run_of(client, unplaced["id"])["status"] == "starting", "admitted: it fits the cluster's total"
    assert jobs.get_job_status(handle).value == "PENDING" and not jobs.get_job_info(handle).driver_node_id
    answer = client.post(f"/runs/{unplaced['id']}/stop", params={"wait_s": scaled(60)}).json()
    assert answer["status"] == "stopped" and answer["failure"] is None, (answer["status"], answer["failure"])
    assert answer["processes"] == []
    client.post(f"/runs/{beside['id']}/stop", params={"wait_s": scaled(120)})

    starting = trainer_started(client, gpu_run["id"])
    trainer = pid_of(starting, "trainer") or 0
    assert visible_devices(trainer) == "0", "the trainer does not see Ray's GPU"
    assert "rlctl.supervisor.forkserver" in psutil.Process(trainer).parent().cmdline(), (
        "forked from the run's fork server"
    )
    stopped_during_start_up(client, jobs, gpu_run["id"])
    wait_for_status(client, beside["id"], {"stopped"}, timeout=60)
    # Placed once the others freed the nodes, the cancelled job ends at once: its node gets no plan.
    wait_until(
        lambda: jobs.get_job_status(handle).value in ("STOPPED", "FAILED"), timeout=120, message="the cancelled job"
    )
    assert run_of(client, unplaced["id"])["processes"] == [], "a process of the cancelled run started"
    wait_until(
        lambda: (
            not leftover_processes(cluster.node_data_dir("worker"))
            and not leftover_processes(cluster.node_data_dir("head"))
        ),
        timeout=60,
        message="the node-side supervisors exiting after the stops",
    )


def placed(jobs: JobSubmissionClient, client: httpx.Client, run_id: str) -> str:
    """The node Ray placed the run's job on, once it has."""

    def node() -> str | None:
        handle = run_of(client, run_id)["executor_handle"]
        return str(jobs.get_job_info(handle).driver_node_id or "") if handle else None

    return wait_until(node, timeout=120, interval=0.2, message=f"Ray placing run {run_id}")


def spread_queue_logs_and_a_lost_node(
    client: httpx.Client, jobs: JobSubmissionClient, cluster: RayCluster, head: str, worker: str
) -> str:
    """Two runs fill the cluster, a third waits `queued`; one stopped during start-up frees its slot, the third
    takes it; the two running runs are on the two nodes; logs follow; the worker node dies: its run fails
    `node_lost` with its log tail and leaves nothing. Returns the run left running on the head node."""
    first, second, third = start(client, environment=STUCK), start(client), start(client)
    queued = run_of(client, third["id"])
    assert queued["status"] == "queued" and queued["queue_position"] == 1, queued

    # The first, whose environment never registers, is stopped during its start-up; the queued run starts.
    trainer_started(client, first["id"])
    stopped_during_start_up(client, jobs, first["id"])
    kept = second["id"]
    for run_id in (kept, third["id"]):
        wait_for_status(client, run_id, {"running"}, timeout=300)
    runs = {run_id: run_of(client, run_id) for run_id in (kept, third["id"])}
    assert all(r["executor"] == "ray" and r["executor_handle"].startswith("rlctl-") for r in runs.values())
    placed = {node_of(jobs, run): run_id for run_id, run in runs.items()}
    assert set(placed) == {head, worker}, f"both runs on one node: {placed}"
    on_head, on_worker = placed[head], placed[worker]
    # A run that asked for no GPU sees none, even on the node that has one (Ray sets nothing for it).
    assert visible_devices(pid_of(runs[on_worker], "trainer") or 0) == ""

    # Logs follow for a run on another node: new trainer lines arrive through the node's reports.
    assert len(followed_lines(client, on_head, "trainer", wanted=2)) == 2
    wait_until(
        lambda: client.get(f"/runs/{on_head}/metrics", params={"name": "reward/mean"}).json()["metrics"],
        timeout=180,
        message="metrics of the run on the head node",
    )

    # The second node dies as a machine would: its run fails node_lost with its log tail, nothing is left.
    lost_pids = [p["pid"] for p in runs[on_worker]["processes"]]
    cluster.kill_worker_node()
    lost = wait_for_status(client, on_worker, {"failed"}, timeout=120)
    assert lost["failure"]["kind"] == "node_lost", lost["failure"]
    assert lost["failure"]["log_tail"], "no log tail in the node_lost failure"
    wait_until(lambda: not any(process_alive(pid) for pid in lost_pids), timeout=60, message="orphans")
    # The node-side supervisor itself exits once its last report is taken.
    wait_until(
        lambda: not leftover_processes(cluster.node_data_dir("worker")),
        timeout=60,
        message="the lost node's supervisor exiting",
    )
    assert run_of(client, on_head)["status"] == "running"
    return on_head


def restart_re_attaches_then_a_stop(
    settings: Settings, port: int, jobs: JobSubmissionClient, cluster: RayCluster, run_id: str
) -> None:
    """The control plane restarts; the run on Ray goes on and is re-attached by its submission id. A stop then goes
    through Ray: the node stops the three processes, Ray ends the job."""
    step_before = last_step(settings, run_id)
    with live_service(settings, port=port) as live, live.client() as client:
        wait_until(
            lambda: (run_of(client, run_id)["last_step"] or 0) > (step_before or 0),
            timeout=120,
            message="training progress reported after the restart",
        )
        assert run_of(client, run_id)["status"] == "running"
        stopped = client.post(f"/runs/{run_id}/stop", params={"wait_s": scaled(120)}).json()
        assert stopped["status"] == "stopped", stopped.get("failure")
        assert not any(process_alive(p["pid"]) for p in stopped["processes"] if p["pid"])
        wait_until(
            lambda: jobs.get_job_status(stopped["executor_handle"]).value in ("STOPPED", "SUCCEEDED"),
            timeout=60,
            message="Ray ending the stopped run's job",
        )
    wait_until(
        lambda: not leftover_processes(cluster.node_data_dir("head")),
        timeout=60,
        message="the head node's supervisors exiting",
    )


def last_step(settings: Settings, run_id: str) -> int | None:
    from rlctl.service.db.engine import Database
    from rlctl.service.db.models import Run

    db = Database(settings.sqlalchemy_url)
    try:
        with db.session() as session:
            run = session.get(Run, run_id)
            return run.last_step if run else None
    finally:
        db.dispose()
