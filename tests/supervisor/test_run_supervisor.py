"""A run's three processes under one supervisor: start order, readiness, fate sharing, stop, cancel."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from rlctl.supervisor.ports import free_ports
from rlctl.supervisor.process import ExitStatus, ProcessSpec, SupervisedProcess
from rlctl.supervisor.readiness import http_answers
from rlctl.supervisor.run import API, ENV, TRAINER, Outcome, RunPlan, RunSupervisor
from tests.support.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]


class RecordingEvents:
    def __init__(self) -> None:
        self.started: list[str] = []
        self.exited: dict[str, ExitStatus | None] = {}
        self.running_at: float | None = None
        self.stalls: list[bool] = []
        self.outcome: Outcome | None = None
        self.done = threading.Event()

    def process_started(self, process: SupervisedProcess) -> None:
        self.started.append(process.role)

    def running(self) -> None:
        self.running_at = time.monotonic()

    def process_exited(self, process: SupervisedProcess, status: ExitStatus | None) -> None:
        self.exited[process.role] = status

    def stall_changed(self, stalled: bool, idle_s: float) -> None:
        self.stalls.append(stalled)

    def tick(self) -> None:
        pass

    def finished(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.done.set()


def fake(tmp_path: Path, role: str, *args: str, port: int | None = None, timeout: float = 30) -> ProcessSpec:
    argv = [sys.executable, "-m", "tests.support.fake_process", *args]
    if port:
        argv += ["--port", str(port)]
    return ProcessSpec(
        role=role,
        argv=argv,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
        log_path=tmp_path / f"{role}.log",
        ready=http_answers(f"http://127.0.0.1:{port}/health") if port else None,
        ready_timeout_s=timeout,
    )


def plan(specs: list[ProcessSpec], **overrides: object) -> RunPlan:
    values: dict[str, object] = {
        "run_id": "t",
        "specs": specs,
        "progress": lambda: None,
        "finished_steps": lambda role: None,
        "stop_grace_s": 2.0,
        "poll_interval_s": 0.1,
    }
    values.update(overrides)
    return RunPlan(**values)  # type: ignore[arg-type]


@pytest.fixture
def supervisors():
    created: list[RunSupervisor] = []
    yield created
    for supervisor in created:
        supervisor.stop()
        supervisor.join(60)


def run(supervisors: list, run_plan: RunPlan) -> tuple[RunSupervisor, RecordingEvents]:
    events = RecordingEvents()
    supervisor = RunSupervisor(run_plan, events)
    supervisors.append(supervisor)
    supervisor.start()
    return supervisor, events


def three(tmp_path: Path, trainer_args: tuple[str, ...] = (), env_args: tuple[str, ...] = ()) -> list[ProcessSpec]:
    api_port, trainer_port = free_ports(2)
    return [
        fake(tmp_path, API, port=api_port),
        fake(tmp_path, TRAINER, *trainer_args, port=trainer_port),
        fake(tmp_path, ENV, *env_args),
    ]


def test_starts_in_order_and_completes_when_the_trainer_finishes(tmp_path: Path, supervisors: list) -> None:
    supervisor, events = run(supervisors, plan(three(tmp_path, trainer_args=("--exit-after", "2"))))
    assert events.done.wait(60)
    assert events.started == [API, TRAINER, ENV]
    assert events.running_at is not None
    assert events.outcome == Outcome("completed")
    assert events.exited[TRAINER] == ExitStatus(code=0)
    assert set(events.exited) == {API, TRAINER, ENV}  # the others were stopped (fate sharing)


def test_the_next_process_waits_for_readiness(tmp_path: Path, supervisors: list) -> None:
    api_port, trainer_port = free_ports(2)
    specs = [
        fake(tmp_path, API, "--ready-after", "1.5", port=api_port),
        fake(tmp_path, TRAINER, port=trainer_port),
        fake(tmp_path, ENV),
    ]
    supervisor, events = run(supervisors, plan(specs))
    wait_until(lambda: events.running_at, timeout=60, message="running")
    api_log = (tmp_path / "api.log").stat().st_mtime
    trainer_log = (tmp_path / "trainer.log").stat().st_mtime
    assert trainer_log - api_log >= 1.0


def test_a_killed_trainer_fails_the_run_with_its_log_tail(tmp_path: Path, supervisors: list) -> None:
    supervisor, events = run(supervisors, plan(three(tmp_path)))
    wait_until(lambda: events.running_at, timeout=60, message="running")
    os.kill(supervisor.processes[TRAINER].identity.pid, signal.SIGKILL)
    assert events.done.wait(60)
    failure = events.outcome.failure
    assert events.outcome.status == "failed"
    assert failure.process == TRAINER and failure.signal == signal.SIGKILL and failure.kind == "process_exited"
    assert any("started pid" in line for line in failure.log_tail)
    assert events.exited[ENV] is not None and events.exited[API] is not None


def test_a_trainer_exiting_nonzero_fails_the_run(tmp_path: Path, supervisors: list) -> None:
    specs = three(tmp_path, trainer_args=("--exit-after", "1", "--code", "7"))
    supervisor, events = run(supervisors, plan(specs))
    assert events.done.wait(60)
    assert events.outcome.status == "failed" and events.outcome.failure.exit_code == 7


def test_a_failure_kind_the_trainer_reports_is_the_runs(tmp_path: Path, supervisors: list) -> None:
    specs = three(tmp_path, trainer_args=("--exit-after", "1", "--code", "1"))
    reported = ("sampling_failed", "5 consecutive sampling calls failed (budget 5)")
    supervisor, events = run(
        supervisors, plan(specs, reported_failure=lambda role: reported if role == TRAINER else None)
    )
    assert events.done.wait(60)
    failure = events.outcome.failure
    assert failure.kind == "sampling_failed" and failure.process == TRAINER and failure.exit_code == 1
    assert failure.message == "trainer exited with code 1: 5 consecutive sampling calls failed (budget 5)"
    assert any("exiting with 1" in line for line in failure.log_tail)


def test_a_trainer_exiting_zero_before_its_steps_fails(tmp_path: Path, supervisors: list) -> None:
    specs = three(tmp_path, trainer_args=("--exit-after", "1"))
    supervisor, events = run(supervisors, plan(specs, finished_steps=lambda role: False))
    assert events.done.wait(60)
    assert events.outcome.status == "failed"
    assert "before finishing its steps" in events.outcome.failure.message


def test_a_clean_environment_exit_lets_the_trainer_drain(tmp_path: Path, supervisors: list) -> None:
    specs = three(tmp_path, trainer_args=("--exit-after", "3"), env_args=("--exit-after", "0.5"))
    supervisor, events = run(supervisors, plan(specs))
    assert events.done.wait(60)
    assert events.outcome == Outcome("completed")
    assert events.exited[ENV] == ExitStatus(code=0)


def test_a_crashed_environment_fails_the_run(tmp_path: Path, supervisors: list) -> None:
    specs = three(tmp_path, env_args=("--exit-after", "0.5", "--code", "1"))
    supervisor, events = run(supervisors, plan(specs))
    assert events.done.wait(60)
    assert events.outcome.status == "failed" and events.outcome.failure.process == ENV


@pytest.mark.parametrize("role", [ENV, API, TRAINER])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_a_process_killed_by_a_signal_fails_the_run_at_once_naming_it(
    tmp_path: Path, supervisors: list, role: str, sig: signal.Signals
) -> None:
    """Fate sharing by exit status: a signal death is never a clean end. The drain time-out is long, so a run
    that mistook the killed environment for a clean finish would still be running at the bound below."""
    supervisor, events = run(supervisors, plan(three(tmp_path), drain_timeout_s=600.0))
    wait_until(lambda: events.running_at, timeout=60, message="running")
    killed_at = time.monotonic()
    os.kill(supervisor.processes[role].identity.pid, sig)
    assert events.done.wait(30), f"the run did not end within 30 s of the {role} being killed"
    assert time.monotonic() - killed_at < 30
    failure = events.outcome.failure
    assert events.outcome.status == "failed"
    assert failure.kind == "process_exited" and failure.process == role
    assert failure.signal == sig and failure.exit_code is None
    assert f"killed by signal {sig.name}" in failure.message
    assert events.exited[role] == ExitStatus(signal=sig)


def test_stop_ends_the_run_in_reverse_order(tmp_path: Path, supervisors: list) -> None:
    supervisor, events = run(supervisors, plan(three(tmp_path)))
    wait_until(lambda: events.running_at, timeout=60, message="running")
    supervisor.stop()
    assert events.done.wait(60)
    assert events.outcome == Outcome("stopped")
    assert list(events.exited) == [ENV, TRAINER, API]


def test_stop_during_start_up_cancels_the_rest(tmp_path: Path, supervisors: list) -> None:
    api_port, trainer_port = free_ports(2)
    specs = [
        fake(tmp_path, API, port=api_port),
        fake(tmp_path, TRAINER, "--ready-after", "600", port=trainer_port, timeout=600),
        fake(tmp_path, ENV),
    ]
    supervisor, events = run(supervisors, plan(specs))
    wait_until(lambda: TRAINER in events.started, timeout=60, message="trainer spawned")
    supervisor.stop()
    assert events.done.wait(30)
    assert events.outcome == Outcome("stopped")
    assert ENV not in events.started  # never spawned
    assert set(events.exited) == {API, TRAINER}


def test_readiness_timeout_fails_with_the_process_named(tmp_path: Path, supervisors: list) -> None:
    api_port = free_ports(1)[0]
    specs = [fake(tmp_path, API, "--ready-after", "600", port=api_port, timeout=1.0), fake(tmp_path, TRAINER)]
    supervisor, events = run(supervisors, plan(specs))
    assert events.done.wait(60)
    assert events.outcome.failure.kind == "readiness_timeout" and events.outcome.failure.process == API


def test_no_progress_is_flagged_as_stalled_and_cleared_when_it_resumes(tmp_path: Path, supervisors: list) -> None:
    step = {"value": 0}
    supervisor, events = run(supervisors, plan(three(tmp_path), progress=lambda: step["value"], stall_after_s=0.5))
    wait_until(lambda: events.stalls == [True], timeout=30, message="stalled")
    step["value"] = 1
    wait_until(lambda: events.stalls == [True, False], timeout=30, message="unstalled")


def test_detach_leaves_the_processes_running(tmp_path: Path, supervisors: list) -> None:
    supervisor, events = run(supervisors, plan(three(tmp_path)))
    wait_until(lambda: events.running_at, timeout=60, message="running")
    processes = dict(supervisor.processes)
    supervisor.detach()
    assert supervisor.join(30)
    assert events.outcome is None
    try:
        assert all(p.poll() is None for p in processes.values())
    finally:
        for process in processes.values():
            process.terminate(grace_s=2)


def at_once(spec: ProcessSpec, after: tuple[str, ...] = ()) -> ProcessSpec:
    return dataclasses.replace(spec, after=after)


def test_processes_that_wait_for_nothing_are_spawned_at_once(tmp_path: Path, supervisors: list) -> None:
    """A run's plan (rlctl/service/runs/launch.py) spawns all three at once: the trainer and the environment are spawned
    while the API is still not ready (in the one-after-another order they could not be), and the run is not
    running before every process is ready. (test_a_probe_waits_for_the_roles_it_names sees such a run reach
    running.) No clock is read: on a loaded machine a process's start can take seconds."""
    api_port, trainer_port = free_ports(2)
    specs = [
        at_once(fake(tmp_path, API, "--ready-after", "600", port=api_port, timeout=600)),
        at_once(fake(tmp_path, TRAINER, port=trainer_port)),
        at_once(fake(tmp_path, ENV)),
    ]
    supervisor, events = run(supervisors, plan(specs))
    wait_until(lambda: len(events.started) == 3, timeout=60, message="all three spawned before the API is ready")
    assert events.started == [API, TRAINER, ENV]
    assert events.running_at is None  # the API is not ready
    assert all(supervisor.processes[role].poll() is None for role in (API, TRAINER, ENV))


def test_a_process_waits_only_for_the_roles_it_names(tmp_path: Path, supervisors: list) -> None:
    api_port, trainer_port = free_ports(2)
    specs = [
        at_once(fake(tmp_path, API, "--ready-after", "1.5", port=api_port)),
        at_once(fake(tmp_path, TRAINER, "--ready-after", "600", port=trainer_port, timeout=600)),
        at_once(fake(tmp_path, ENV), after=(API,)),
    ]
    supervisor, events = run(supervisors, plan(specs))
    wait_until(lambda: ENV in events.started, timeout=60, message="env spawned once the API is ready")
    api_log = (tmp_path / "api.log").stat().st_mtime
    env_log = (tmp_path / "env.log").stat().st_mtime
    assert env_log - api_log >= 1.0
    assert events.running_at is None  # the trainer is not ready yet


def test_a_stop_while_all_start_at_once_stops_them_all(tmp_path: Path, supervisors: list) -> None:
    api_port, trainer_port = free_ports(2)
    specs = [
        at_once(fake(tmp_path, API, port=api_port)),
        at_once(fake(tmp_path, TRAINER, "--ready-after", "600", port=trainer_port, timeout=600)),
        at_once(fake(tmp_path, ENV)),
    ]
    supervisor, events = run(supervisors, plan(specs))
    wait_until(lambda: len(events.started) == 3, timeout=60, message="all spawned")
    supervisor.stop()
    assert events.done.wait(30)
    assert events.outcome == Outcome("stopped")
    assert list(events.exited) == [ENV, TRAINER, API]


def test_a_process_exiting_while_another_starts_fails_the_run_naming_it(tmp_path: Path, supervisors: list) -> None:
    api_port, trainer_port = free_ports(2)
    specs = [
        at_once(fake(tmp_path, API, port=api_port)),
        at_once(fake(tmp_path, TRAINER, "--ready-after", "600", port=trainer_port, timeout=600)),
        at_once(fake(tmp_path, ENV, "--port", str(free_ports(1)[0]), "--exit-after", "0.5", "--code", "3")),
    ]
    specs[2] = dataclasses.replace(specs[2], ready=http_answers("http://127.0.0.1:9/never"))
    supervisor, events = run(supervisors, plan(specs))
    assert events.done.wait(60)
    failure = events.outcome.failure
    assert failure.kind == "process_exited" and failure.process == ENV and failure.exit_code == 3
    assert set(events.exited) == {API, TRAINER, ENV}


def test_each_readiness_time_out_counts_from_its_own_spawn(tmp_path: Path, supervisors: list) -> None:
    api_port, trainer_port = free_ports(2)
    specs = [
        at_once(fake(tmp_path, API, port=api_port)),
        at_once(fake(tmp_path, TRAINER, "--ready-after", "600", port=trainer_port, timeout=1.0)),
        at_once(fake(tmp_path, ENV)),
    ]
    supervisor, events = run(supervisors, plan(specs))
    assert events.done.wait(60)
    assert events.outcome.failure.kind == "readiness_timeout" and events.outcome.failure.process == TRAINER


def test_a_probe_waits_for_the_roles_it_names(tmp_path: Path, supervisors: list) -> None:
    """The environment's probe asks the API, which answers 500 until an environment registered: it is not asked
    before the trainer is ready."""
    api_port, trainer_port = free_ports(2)
    probed: list[float] = []

    def env_probe() -> bool:
        probed.append(time.monotonic())
        return True

    specs = [
        at_once(fake(tmp_path, API, port=api_port)),
        at_once(fake(tmp_path, TRAINER, "--ready-after", "2", port=trainer_port)),
        dataclasses.replace(at_once(fake(tmp_path, ENV)), ready=env_probe, probe_after=(TRAINER,)),
    ]
    started = time.monotonic()
    supervisor, events = run(supervisors, plan(specs))
    wait_until(lambda: events.running_at, timeout=60, message="running")
    assert probed and min(probed) - started >= 2.0
    assert events.started == [API, TRAINER, ENV]
