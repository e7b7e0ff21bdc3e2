"""Admission and the queue (docs/RUNS.md#admission): runs beyond RLCTL_MAX_CONCURRENT_RUNS wait `queued` in
priority then arrival order, a queued run stops without starting, a freed slot admits the next run exactly once,
and the queue survives a restart of the service. Resources are validated and stored (docs/RUNS.md#resources)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update

from rlctl.service.app import create_app
from rlctl.service.context import replica_identity
from rlctl.service.db.engine import Database
from rlctl.service.db.models import Run, RunProcess
from rlctl.service.runs import admission
from rlctl.service.runs.manager import ExecutorUnavailable
from rlctl.service.settings import Settings
from rlctl.supervisor.executor import NO_RESOURCES, Resources, Usage
from rlctl.supervisor.local import Host, LocalExecutor, available_memory_gb
from rlctl.supervisor.start_time import start_time_of
from tests.runs.conftest import wait_for_status
from tests.support.live import Service, in_process_service
from tests.support.reaper import process_alive
from tests.support.waiting import wait_until

SMALL = {"cpus": 0.5, "gpus": 0, "memory_gb": 0.01}  # fits any host's free memory: only the run limit queues
REPO_ROOT = Path(__file__).resolve().parents[2]


def start(client: httpx.Client, priority: int = 0) -> dict[str, Any]:
    body = {"environment": "echo", "backend": "local", "resources": SMALL, "priority": priority}
    response = client.post("/runs", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def queue(client: httpx.Client) -> list[tuple[str, int]]:
    """GET /runs?status=queued: (id, position) in queue order."""
    return [(r["id"], r["queue_position"]) for r in client.get("/runs", params={"status": "queued"}).json()["runs"]]


def stop(client: httpx.Client, run_id: str, wait_s: float = 0) -> dict[str, Any]:
    response = client.post(f"/runs/{run_id}/stop", params={"wait_s": wait_s})
    assert response.status_code == 200, response.text
    return response.json()


# --- through the API, with real processes for the runs that start ---


@pytest.mark.e2e
def test_runs_beyond_the_limit_queue_in_priority_order_and_start_when_a_slot_frees(
    run_settings: Callable[..., Settings],
) -> None:
    with in_process_service(run_settings(max_concurrent_runs=1)) as live, live.client() as client:
        first = start(client)
        assert first["status"] in {"pending", "starting"} and first["queue_position"] is None
        assert first["resources"] == SMALL and first["executor"] == "local" and first["executor_handle"] is None
        second, third = start(client), start(client)
        assert (second["status"], second["queue_position"]) == ("queued", 1)
        assert (third["status"], third["queue_position"]) == ("queued", 2)
        urgent = start(client, priority=5)  # jumps the queue
        assert (urgent["status"], urgent["queue_position"]) == ("queued", 1)
        assert queue(client) == [(urgent["id"], 1), (second["id"], 2), (third["id"], 3)]
        assert client.get(f"/runs/{second['id']}").json()["queue_position"] == 2

        listed = client.post("/tools/rl_list_runs", json={"status": "queued"}).json()
        assert [(r["run_id"], r["queue_position"]) for r in listed["runs"]] == queue(client)

        # A queued run stops at once, without a process; the runs behind it move up.
        stopped = stop(client, urgent["id"])
        assert stopped["status"] == "stopped" and stopped["processes"] == [] and stopped["queue_position"] is None
        assert queue(client) == [(second["id"], 1), (third["id"], 2)]

        # The first run ends: the next one starts, the last moves up.
        assert stop(client, first["id"], wait_s=120)["status"] == "stopped"
        wait_until(
            lambda: client.get(f"/runs/{second['id']}").json()["processes"],
            timeout=120,
            message="the next run starts its processes",
        )
        assert client.get(f"/runs/{second['id']}").json()["status"] in {"starting", "running"}
        assert queue(client) == [(third["id"], 1)]
        assert stop(client, second["id"], wait_s=120)["status"] == "stopped"
        wait_for_status(client, third["id"], {"starting", "running"}, timeout=60)
        assert stop(client, third["id"], wait_s=120)["status"] == "stopped"
        assert client.get(f"/runs/{urgent['id']}").json()["started_at"] is None


@pytest.fixture
def slot_holder(run_settings: Callable[..., Settings], process_database_url: str) -> Iterator[str]:
    """A `running` run of this replica whose one process is real (a sleeper), so it holds the only slot until it
    is stopped, without the cost of a real run's start-up; the service re-adopts it on every start."""
    settings = run_settings()
    sleeper = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_process"],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    db = Database(process_database_url)
    try:
        with db.session() as session:
            session.add(
                Run(
                    id="holder",
                    environment="echo",
                    backend="local",
                    status="running",
                    owner_id=replica_identity(settings),
                    resources=SMALL,
                    config={},
                    ports={"api": 1, "inference": 2},
                    heartbeat_at=datetime.now(UTC),
                    created_at=datetime.now(UTC) - timedelta(minutes=1),
                )
            )
            session.add(
                RunProcess(
                    run_id="holder",
                    role="trainer",
                    pid=sleeper.pid,
                    pgid=sleeper.pid,
                    start_time=start_time_of(sleeper.pid),
                    log_path=str(settings.data_path / "holder.log"),
                    status="running",
                )
            )
        yield "holder"
    finally:
        db.dispose()
        if sleeper.poll() is None:
            sleeper.kill()
        sleeper.wait()


@pytest.mark.e2e
def test_queued_runs_stay_queued_across_a_restart_and_start_when_a_slot_frees(
    run_settings: Callable[..., Settings], slot_holder: str
) -> None:
    settings = run_settings(max_concurrent_runs=1)
    with in_process_service(settings) as live, live.client() as client:
        assert client.get(f"/runs/{slot_holder}").json()["status"] == "running"
        waiting = [start(client)["id"], start(client)["id"]]
        assert queue(client) == [(waiting[0], 1), (waiting[1], 2)]
    # The service stopped (its runs detached) and starts again on the same database and data directory.
    with in_process_service(settings) as live, live.client() as client:
        assert client.get(f"/runs/{slot_holder}").json()["status"] == "running"
        assert queue(client) == [(waiting[0], 1), (waiting[1], 2)]
        holder_pid = client.get(f"/runs/{slot_holder}").json()["processes"][0]["pid"]
        assert stop(client, slot_holder, wait_s=120)["status"] == "stopped"
        assert not process_alive(holder_pid)
        wait_until(
            lambda: client.get(f"/runs/{waiting[0]}").json()["processes"],
            timeout=120,
            message="the first queued run starts after the restart",
        )
        assert queue(client) == [(waiting[1], 1)]
        assert stop(client, waiting[0], wait_s=120)["status"] == "stopped"
        wait_for_status(client, waiting[1], {"starting", "running"}, timeout=60)
        assert stop(client, waiting[1], wait_s=120)["status"] == "stopped"


# --- admission against the database alone (both engines): order and exactly-once ---


def waiting_run(run_id: str, minutes_ago: float, priority: int = 0, status: str = "pending") -> Run:
    return Run(
        id=run_id,
        environment="echo",
        backend="local",
        status=status,
        owner_id="r1",
        resources=SMALL,
        priority=priority,
        config={},
        created_at=datetime.now(UTC) - timedelta(minutes=minutes_ago),
    )


def statuses(db: Database) -> dict[str, str]:
    with db.read() as session:
        return {run_id: status for run_id, status in session.execute(select(Run.id, Run.status))}


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    yield database
    database.dispose()


def limited(max_runs: int) -> LocalExecutor:
    return LocalExecutor(max_runs=max_runs, host=Host(cpus=2, gpus=0, memory_gb=1024))


def test_admission_takes_priority_then_arrival_and_the_head_blocks_the_rest(db: Database) -> None:
    with db.session() as session:
        session.add_all(
            [waiting_run("a", 5), waiting_run("b", 4), waiting_run("c", 3, priority=2), waiting_run("d", 2)]
        )
    with db.session() as session:
        assert admission.admit(session, limited(2), "r1") == ["c", "a"]
    assert statuses(db) == {"a": "starting", "b": "queued", "c": "starting", "d": "queued"}
    assert db.run_plan(admission.queue_positions_plan(["a", "b", "d"])) == {"b": 1, "d": 2}
    # A run bigger than the free memory heads the queue: it waits, and the small one behind it does not overtake.
    with db.session() as session:
        session.execute(update(Run).where(Run.id == "b").values(resources={**SMALL, "memory_gb": 1000}))
        session.execute(update(Run).where(Run.id.in_(["a", "c"])).values(status="completed"))
    with db.session() as session:
        assert admission.admit(session, limited(2), "r1") == []
    assert statuses(db)["d"] == "queued"


def test_a_freed_slot_admits_exactly_one_run_however_many_decide_at_once(db: Database) -> None:
    with db.session() as session:
        session.add_all([waiting_run(f"w{i}", 10 - i) for i in range(6)])
    executor = limited(1)
    decisions = 8

    def decide_together() -> list[str]:
        barrier = threading.Barrier(decisions)
        admitted: list[str] = []
        errors: list[BaseException] = []

        def decide() -> None:
            try:
                barrier.wait()
                with db.session() as session:
                    admitted.extend(admission.admit(session, executor, "r1"))
            except BaseException as exc:  # noqa: BLE001 - reported by the test below
                errors.append(exc)

        threads = [threading.Thread(target=decide) for _ in range(decisions)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors, errors
        return admitted

    assert decide_together() == ["w0"]
    for expected in ("w1", "w2"):
        with db.session() as session:  # the admitted run ends: one slot frees
            session.execute(update(Run).where(Run.status == "starting").values(status="completed"))
        assert decide_together() == [expected]
    assert sorted(s for s in statuses(db).values()) == [
        "completed",
        "completed",
        "queued",
        "queued",
        "queued",
        "starting",
    ]


def test_a_queued_run_stopped_meanwhile_is_never_admitted(db: Database) -> None:
    with db.session() as session:
        session.add_all([waiting_run("q1", 3, status="queued"), waiting_run("q2", 2, status="queued")])
    with db.session() as session:
        session.execute(update(Run).where(Run.id == "q1").values(status="stopped"))
    with db.session() as session:
        assert admission.admit(session, limited(1), "r1") == ["q2"]


def test_the_local_executor_counts_runs_gpus_and_free_memory() -> None:
    host = Host(cpus=2, gpus=1, memory_gb=available_memory_gb() + 100)
    executor = LocalExecutor(max_runs=2, host=host)
    small, gpu = Resources(1, 0, 0.01), Resources(1, 1, 0.01)
    idle = Usage(0, NO_RESOURCES, NO_RESOURCES)
    assert executor.fits(small, idle) and executor.fits(gpu, idle)
    assert not executor.fits(small, Usage(2, NO_RESOURCES, NO_RESOURCES)), "the run limit"
    assert not executor.fits(gpu, Usage(1, gpu, NO_RESOURCES)), "the host's one GPU is taken"
    assert not executor.fits(Resources(1, 0, available_memory_gb() + 50), idle), "more than the free memory"
    promised = Resources(0, 0, available_memory_gb() - 0.5)  # a starting run's memory, not yet taken
    assert not executor.fits(Resources(1, 0, 1), Usage(1, promised, promised))
    assert LocalExecutor().fits(small, Usage(1000, NO_RESOURCES, NO_RESOURCES)), "no run limit unless set"
    assert executor.refusal(Resources(1, 2, 1)) is not None and executor.refusal(Resources(3, 0, 1)) is not None
    assert executor.refusal(Resources(2, 1, 1)) is None


# --- validation and settings ---


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        ({"resources": {"cpus": 0}}, "VALIDATION_ERROR"),
        ({"resources": {"gpus": -1}}, "VALIDATION_ERROR"),
        ({"resources": {"gpus": 1.5}}, "VALIDATION_ERROR"),
        ({"resources": {"memory_gb": "lots"}}, "VALIDATION_ERROR"),
        ({"resources": {"disk_gb": 1}}, "VALIDATION_ERROR"),
        ({"priority": 5000}, "VALIDATION_ERROR"),
        ({"resources": {"gpus": 64}}, "RESOURCES_EXCEED_CAPACITY"),
        ({"resources": {"memory_gb": 65536}}, "RESOURCES_EXCEED_CAPACITY"),
    ],
)
def test_bad_resources_are_refused_and_change_nothing(service: Service, extra: dict, code: str) -> None:
    with service.client() as client:
        response = client.post("/runs", json={"environment": "echo", "backend": "local", **extra})
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == code
        assert client.get("/runs").json()["count"] == 0


def test_defaults_per_backend_are_written_once() -> None:
    from rlctl.service.runs.resources import default_resources
    from rlctl.service.settings import Backend

    assert default_resources(Backend.LOCAL, has_gpus=True) == Resources(1.0, 1, 1.0)
    assert default_resources(Backend.LOCAL, has_gpus=False) == Resources(1.0, 0, 1.0)
    assert default_resources(Backend.TINKER, has_gpus=True).gpus == 0


def test_the_ray_executor_is_reserved_with_a_clear_start_up_error(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(executor="ray", ray_address="ray://127.0.0.1:10001")
    with pytest.raises(ExecutorUnavailable, match="RLCTL_EXECUTOR=ray"):
        create_app(settings)
    with pytest.raises(ValueError, match="executor"):
        make_settings(executor="slurm")
    assert make_settings(max_concurrent_runs="").max_concurrent_runs is None
