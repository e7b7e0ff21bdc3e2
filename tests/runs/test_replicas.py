"""Several replicas share one database: each run belongs to the replica that launched it (docs/RUNS.md#replicas)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rlctl.service.db.engine import Database
from rlctl.service.db.models import Run, RunProcess
from rlctl.service.runs.manager import RunManager
from rlctl.service.settings import Settings
from rlctl.supervisor.start_time import start_time_of
from tests.runs.conftest import wait_for_status
from tests.support.live import in_process_service
from tests.support.reaper import process_alive
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def test_runs_of_a_dead_replica_end_with_a_reason_and_its_processes_are_not_signalled(
    run_settings: Callable[..., Settings], process_database_url: str
) -> None:
    # A process that "belongs" to the other replica's run: alive, recorded with its real identity.
    foreign = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    try:
        with in_process_service(run_settings()) as live:
            db = Database(process_database_url)
            with db.session() as session:
                session.add(
                    Run(
                        id="orphaned",
                        environment="echo",
                        backend="local",
                        status="running",
                        owner_id="replica-that-died",
                        heartbeat_at=datetime.now(UTC) - timedelta(hours=1),
                    )
                )
            with db.session() as session:
                session.add(
                    RunProcess(
                        run_id="orphaned",
                        role="trainer",
                        pid=foreign.pid,
                        pgid=foreign.pid,
                        start_time=start_time_of(foreign.pid),
                        status="running",
                    )
                )
            db.dispose()
            RunManager.of(live.app.state.context).recover()  # what a start-up (or the heartbeat sweep) does
            with live.client() as client:
                run = client.get("/runs/orphaned").json()
        assert run["status"] == "failed"
        assert run["failure"]["kind"] == "owner_lost" and "replica-that-died" in run["failure"]["message"]
        assert foreign.poll() is None, "a replica signalled a process it does not own"
    finally:
        foreign.kill()
        foreign.wait()
        _forget_foreign_process(process_database_url)


def test_a_stop_asked_of_another_replica_is_carried_out_by_the_owner(
    run_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    owner_settings = run_settings(local_total_steps=10_000, replica_id="owner")
    other_settings = run_settings(data_dir=tmp_path / "other", replica_id="other")
    with in_process_service(owner_settings) as owner, in_process_service(other_settings) as other:
        with owner.client() as client:
            run_id = client.post("/runs", json={"environment": "echo", "backend": "local"}).json()["id"]
            running = wait_for_status(client, run_id, {"running"}, timeout=240)
        with other.client() as client:
            assert client.get(f"/runs/{run_id}").json()["status"] == "running"  # shared records
            assert client.post(f"/runs/{run_id}/stop").json()["status"] == "stopping"
        with owner.client() as client:
            stopped = wait_for_status(client, run_id, {"stopped"}, timeout=120)
        assert stopped["status"] == "stopped"
        pids = [p["pid"] for p in running["processes"]]
        wait_until(lambda: not any(process_alive(pid) for pid in pids), timeout=30, message="owner stopped them")


def _forget_foreign_process(database_url: str) -> None:
    """The bystander is gone; drop its row so the clean-up check does not look for it."""
    db = Database(database_url)
    with db.session() as session:
        session.query(RunProcess).filter(RunProcess.run_id == "orphaned").delete()
    db.dispose()
