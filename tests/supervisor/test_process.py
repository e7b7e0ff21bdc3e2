"""Supervised processes: groups, SIGTERM then SIGKILL, reaping, and never signalling a reused pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from rlctl.supervisor.process import (
    ExitStatus,
    Liveness,
    ProcessIdentity,
    ProcessSpec,
    SupervisedProcess,
    identity_liveness,
    live_group_members,
)
from rlctl.supervisor.start_time import start_time_of
from tests.support.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]


def spec(tmp_path: Path, *args: str, role: str = "fake") -> ProcessSpec:
    return ProcessSpec(
        role=role,
        argv=[sys.executable, "-m", "tests.support.fake_process", *args],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
        log_path=tmp_path / "logs" / f"{role}.log",
    )


@pytest.fixture
def spawned():
    processes: list[SupervisedProcess] = []
    yield processes
    for process in processes:
        process.terminate(grace_s=1)


def log_has(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text()


def test_spawn_runs_in_its_own_group_and_logs_to_its_file(tmp_path: Path, spawned: list) -> None:
    process = SupervisedProcess.spawn(spec(tmp_path))
    spawned.append(process)
    assert process.identity.pgid == process.identity.pid != os.getpgid(0)
    wait_until(lambda: log_has(process.log_path, "started pid"), timeout=30, message="log line")
    assert identity_liveness(process.identity) is Liveness.ALIVE
    status = process.terminate(grace_s=5)
    assert status == ExitStatus(code=0)  # it handled SIGTERM by exiting cleanly
    assert process.liveness() is Liveness.DEAD


def test_a_process_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: Path, spawned: list) -> None:
    process = SupervisedProcess.spawn(spec(tmp_path, "--ignore-sigterm"))
    spawned.append(process)
    wait_until(lambda: log_has(process.log_path, "started pid"), timeout=30, message="start")
    started = time.monotonic()
    status = process.terminate(grace_s=1.0)
    assert status == ExitStatus(signal=signal.SIGKILL)
    assert time.monotonic() - started >= 1.0
    assert log_has(process.log_path, "ignoring SIGTERM")


def test_grandchildren_go_with_the_group(tmp_path: Path, spawned: list) -> None:
    process = SupervisedProcess.spawn(spec(tmp_path, "--grandchild"))
    spawned.append(process)
    wait_until(lambda: log_has(process.log_path, "started pid"), timeout=30, message="start")
    grandchild = int(process.log_path.read_text().split("grandchild ")[1].split()[0])
    assert grandchild in live_group_members(process.identity.pgid)
    process.terminate(grace_s=2)
    wait_until(lambda: not psutil.pid_exists(grandchild) or _is_zombie(grandchild), timeout=10, message="gone")
    assert live_group_members(process.identity.pgid) == []


def test_exit_codes_are_reported(tmp_path: Path, spawned: list) -> None:
    process = SupervisedProcess.spawn(spec(tmp_path, "--exit-after", "0", "--code", "3"))
    spawned.append(process)
    assert wait_until(process.poll, timeout=30, message="exit") == ExitStatus(code=3)
    assert "code 3" in process.poll().describe()


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        real_start = start_time_of(bystander.pid)
        # A record of "our" process whose pid now belongs to someone else: same pid, other start time.
        stale = ProcessIdentity(bystander.pid, bystander.pid, real_start - 1000)
        assert identity_liveness(stale) is Liveness.DEAD
        adopted = SupervisedProcess.adopt("trainer", stale, tmp_path / "t.log")
        assert adopted.poll() == ExitStatus()
        # Nor is the bystander's group taken for the leftovers of ours: the stop ends at once, not after a grace
        # period spent waiting for someone else's processes.
        stopping = threading.Thread(target=adopted.terminate, kwargs={"grace_s": 3600}, daemon=True)
        stopping.start()
        wait_until(lambda: not stopping.is_alive(), timeout=30, message="the stop of a gone process returning")
        assert bystander.poll() is None, "the bystander was signalled"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_process_is_recognised_after_the_wall_clock_is_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    process = SupervisedProcess.spawn(spec(tmp_path))
    try:
        identity = process.identity
        epoch_record = psutil.Process(identity.pid).create_time()  # what an earlier version recorded
        assert identity_liveness(ProcessIdentity(identity.pid, identity.pgid, epoch_record)) is Liveness.ALIVE, (
            "a record of an earlier version is still read"
        )
        assert identity_liveness(ProcessIdentity(identity.pid, identity.pgid, epoch_record - 5)) is Liveness.DEAD
        # The clock set 5 s ahead (a time sync, a virtual machine resumed): the boot time by the wall clock moves
        # with it, and so does the create time psutil computes from it. The test cannot set the machine's clock,
        # so it moves the boot time psutil reads instead.
        booted = psutil.boot_time()
        monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: booted + 5)
        assert psutil.Process(identity.pid).create_time() == pytest.approx(epoch_record + 5)
        assert identity_liveness(identity) is Liveness.ALIVE, "recognised by its start since the boot"
        process.terminate(grace_s=5)
        assert process.poll() is not None and not live_group_members(identity.pgid), "signalled, and ended"
    finally:
        process.terminate(grace_s=5)


def test_an_adopted_process_is_stopped_and_seen_to_end(tmp_path: Path) -> None:
    orphan = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_process"], cwd=REPO_ROOT, start_new_session=True
    )
    try:
        identity = ProcessIdentity(orphan.pid, orphan.pid, start_time_of(orphan.pid))
        adopted = SupervisedProcess.adopt("env", identity, tmp_path / "e.log")
        assert adopted.poll() is None
        # Its parent is the test, so reap it when it dies, as init would for a real orphan.
        reaper = psutil.Process(orphan.pid)
        adopted.terminate(grace_s=5)
        orphan.wait(timeout=10)
        assert adopted.poll() == ExitStatus()  # code unknown: not our child
        assert not reaper.is_running() or reaper.status() == psutil.STATUS_ZOMBIE
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


def _is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
