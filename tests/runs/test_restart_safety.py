"""The service killed mid-run and started again: runs are re-adopted or finished with a reason, nothing is
orphaned, and a pid now used by an unrelated process is never signalled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from sqlalchemy import update

from rlctl.service.db.engine import Database
from rlctl.service.db.models import RunProcess
from tests.runs.conftest import service_environment, wait_for_status
from tests.support.reaper import process_alive
from tests.support.service_process import ServiceProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def long_run_service(tmp_path: Path, database_url: str) -> ServiceProcess:
    """An `rlctl serve` subprocess whose local runs go on until stopped."""
    env = service_environment(tmp_path / "var", database_url, RLCTL_LOCAL_TOTAL_STEPS="10000")
    return ServiceProcess({**os.environ, **env}, tmp_path / "service.log")


def start_running_run(service: ServiceProcess) -> tuple[str, dict[str, int]]:
    """Start an echo run and wait until it runs; its id and the pids of its processes by role."""
    with service.client() as client:
        run_id = client.post("/runs", json={"environment": "echo", "backend": "local"}).json()["id"]
        run = wait_for_status(client, run_id, {"running"}, timeout=240)
    return run_id, {p["role"]: p["pid"] for p in run["processes"]}


def test_a_killed_service_readopts_its_run(tmp_path: Path, process_database_url: str) -> None:
    service = long_run_service(tmp_path, process_database_url)
    service.start()
    try:
        run_id, pids = start_running_run(service)
        service.kill()
        assert all(psutil.pid_exists(pid) for pid in pids.values()), "a run process died with the service"
        service.start()
        with service.client() as client:
            after = client.get(f"/runs/{run_id}").json()
            assert after["status"] == "running"
            steps = after["last_step"] or 0
            wait_until(
                lambda: (client.get(f"/runs/{run_id}").json()["last_step"] or 0) > steps,
                timeout=120,
                message="training goes on, watched again",
            )
            stopped = client.post(f"/runs/{run_id}/stop", params={"wait_s": 120}).json()
            assert stopped["status"] == "stopped"
        assert not any(process_alive(pid) for pid in pids.values()), "processes outlived the stop"
    finally:
        service.terminate()


def test_a_reused_pid_is_not_signalled_after_a_restart(tmp_path: Path, process_database_url: str) -> None:
    service = long_run_service(tmp_path, process_database_url)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    service.start()
    try:
        run_id, pids = start_running_run(service)
        service.kill()
        # While the service is down the trainer dies, and its pid "comes back" as an unrelated process.
        os.killpg(pids["trainer"], signal.SIGKILL)
        wait_until(lambda: not process_alive(pids["trainer"]), timeout=30, message="trainer gone")
        db = Database(process_database_url)
        with db.session() as session:
            session.execute(
                update(RunProcess)
                .where(RunProcess.run_id == run_id, RunProcess.role == "trainer")
                .values(pid=bystander.pid, pgid=bystander.pid)
            )
        db.dispose()
        service.start()
        with service.client() as client:
            failed = wait_until(
                lambda: (r := client.get(f"/runs/{run_id}").json())["status"] == "failed" and r,
                timeout=120,
                message="run finished with a reason",
            )
        assert failed["failure"]["process"] == "trainer"
        assert "exit code unknown" in failed["failure"]["message"]
        assert bystander.poll() is None, "the unrelated process was signalled"
        assert not process_alive(pids["api"]) and not process_alive(pids["env"])
    finally:
        service.terminate()
        bystander.kill()
        bystander.wait()
