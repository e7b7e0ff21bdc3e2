"""GPU assignment on the local executor (docs/RUNS.md#resources): the host's GPUs are handed out, lowest free id
first, so concurrent runs never share one; each run's processes see exactly its own (CUDA_VISIBLE_DEVICES); a run
that asked for none sees none; a freed GPU goes to the next run; a re-adopted run holds what its handle names.

This machine has no GPU: the host is given GPUs by id, and the processes are real (their environment is read from
/proc), which is all the assignment touches."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import psutil
import pytest

from rlctl.service.runs.resources import default_resources
from rlctl.service.settings import Backend
from rlctl.supervisor.executor import NO_RESOURCES, ProcessRecord, Resources, Usage
from rlctl.supervisor.local import (
    GpuPool,
    Host,
    LocalExecutor,
    gpu_handle,
    host_gpu_ids,
    parse_gpu_handle,
)
from rlctl.supervisor.node import NodeLayout, assigned_gpus
from rlctl.supervisor.node import process_specs as node_process_specs
from rlctl.supervisor.process import ExitStatus, ProcessSpec, SupervisedProcess
from rlctl.supervisor.run import TRAINER, Outcome, RunPlan
from tests.support.waiting import scaled, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
GPU_HOST = Host(cpus=2, gpus=2, memory_gb=1024)


# --- pure logic ---


def test_the_host_gpus_are_its_visible_devices_when_set_else_every_gpu_the_driver_sees() -> None:
    assert host_gpu_ids({}, driver_gpus=3) == ("0", "1", "2")
    assert host_gpu_ids({"CUDA_VISIBLE_DEVICES": "2,3"}, driver_gpus=4) == ("2", "3")
    assert host_gpu_ids({"CUDA_VISIBLE_DEVICES": " 1, 1,GPU-ab12 "}, driver_gpus=4) == ("1", "GPU-ab12")
    assert host_gpu_ids({"CUDA_VISIBLE_DEVICES": ""}, driver_gpus=4) == (), "an empty value hides every GPU"
    assert Host(cpus=1, gpus=2, memory_gb=1).gpu_ids == ("0", "1")
    with pytest.raises(ValueError, match="GPU ids"):
        Host(cpus=1, gpus=2, memory_gb=1, gpu_ids=("0",))


def test_the_pool_hands_out_distinct_gpus_lowest_first_and_takes_them_back() -> None:
    pool = GpuPool(("0", "1", "2"))
    assert pool.take("a", 2) == ("0", "1")
    assert pool.take("a", 2) == ("0", "1"), "asking again returns what the run holds"
    assert pool.take("b", 2) is None, "one GPU is free"
    assert pool.take("c", 0) == ()
    assert pool.take("b", 1) == ("2",)
    assert pool.free() == []
    pool.release("a")
    assert pool.free() == ["0", "1"]
    assert pool.take("d", 1) == ("0",)
    assert pool.hold("e", ("1", "7")) == ("1",), "an id this host no longer has is left out"
    assert pool.free() == []


def test_a_handle_names_the_gpus() -> None:
    assert gpu_handle(("0", "3")) == "gpus:0,3"
    assert parse_gpu_handle("gpus:0,3") == ("0", "3")
    assert parse_gpu_handle(None) == () and parse_gpu_handle("rlctl-abc-123456") == ()


def test_a_local_run_on_a_gpu_host_asks_for_one_gpu_by_default_and_a_tinker_run_for_none() -> None:
    executor = LocalExecutor(host=GPU_HOST)
    assert executor.has_gpus() and not LocalExecutor(host=Host(cpus=2, gpus=0, memory_gb=8)).has_gpus()
    assert default_resources(Backend.LOCAL, executor.has_gpus()).gpus == 1
    assert default_resources(Backend.TINKER, executor.has_gpus()).gpus == 0


def test_admission_counts_the_pool_too() -> None:
    executor = LocalExecutor(host=GPU_HOST)
    idle = Usage(0, NO_RESOURCES, NO_RESOURCES)
    assert executor.fits(Resources(1, 2, 0.01), idle)
    # A run re-adopted from a version that did not record its GPUs' count still holds the ids its handle names.
    executor.gpus.hold("old", ("1",))
    assert not executor.fits(Resources(1, 2, 0.01), idle)
    assert executor.fits(Resources(1, 1, 0.01), idle)
    assert executor.refusal(Resources(1, 3, 0.01)) == "3 GPU(s) asked for; this host has 2"


# --- real processes ---


class Events:
    def __init__(self) -> None:
        self.processes: dict[str, SupervisedProcess] = {}
        self.outcome: Outcome | None = None
        self.done = threading.Event()

    def process_started(self, process: SupervisedProcess) -> None:
        self.processes[process.role] = process

    def running(self) -> None:
        pass

    def process_exited(self, process: SupervisedProcess, status: ExitStatus | None) -> None:
        pass

    def stall_changed(self, stalled: bool, idle_s: float) -> None:
        pass

    def tick(self) -> None:
        pass

    def finished(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.done.set()


def trainer_plan(tmp_path: Path, run_id: str) -> RunPlan:
    spec = ProcessSpec(
        role=TRAINER,
        argv=[sys.executable, "-m", "tests.support.fake_process"],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "CUDA_VISIBLE_DEVICES": "0,1"},  # the service's own
        cwd=REPO_ROOT,
        log_path=tmp_path / f"{run_id}.log",
        ready=None,
        ready_timeout_s=30,
    )
    return RunPlan(run_id, [spec], lambda: None, lambda role: None, stop_grace_s=2.0, poll_interval_s=0.1)


def visible_devices(events: Events) -> str | None:
    """CUDA_VISIBLE_DEVICES as the run's trainer process has it."""
    wait_until(lambda: TRAINER in events.processes, timeout=scaled(30), message="the trainer starting")
    return psutil.Process(events.processes[TRAINER].identity.pid).environ().get("CUDA_VISIBLE_DEVICES")


def test_concurrent_runs_get_distinct_gpus_and_a_freed_gpu_goes_to_the_next(tmp_path: Path) -> None:
    executor = LocalExecutor(host=GPU_HOST)
    runs: dict[str, Events] = {}

    def start(run_id: str, gpus: int) -> str | None:
        runs[run_id] = Events()
        return executor.start(trainer_plan(tmp_path, run_id), runs[run_id], Resources(1, gpus, 0.01))

    try:
        assert start("a", 1) == "gpus:0"
        assert start("b", 1) == "gpus:1"
        assert start("none", 0) is None
        assert visible_devices(runs["a"]) == "0"
        assert visible_devices(runs["b"]) == "1"
        assert visible_devices(runs["none"]) == "", "a run that asked for no GPU sees none"
        assert executor.gpus.free() == []

        executor.stop("a")
        assert runs["a"].done.wait(scaled(30)) and runs["a"].outcome == Outcome("stopped")
        assert executor.gpus.free() == ["0"], "a run's GPUs are free once it ended"
        assert start("c", 1) == "gpus:0"
        assert visible_devices(runs["c"]) == "0"

        # More than is free (admission would have queued it): the run fails, saying so, and holds nothing.
        assert start("greedy", 2) is None
        assert runs["greedy"].done.wait(scaled(30))
        failure = runs["greedy"].outcome.failure if runs["greedy"].outcome else None
        assert failure is not None and failure.kind == "startup_error" and "2 GPU(s) asked for" in failure.message
        assert "greedy" not in runs["greedy"].processes and executor.gpus.held("greedy") is None
    finally:
        for run_id in runs:
            executor.stop(run_id)
        for events in runs.values():
            assert events.done.wait(scaled(30))


def test_a_re_adopted_run_holds_the_gpus_its_handle_names(tmp_path: Path) -> None:
    first = LocalExecutor(host=GPU_HOST)
    events = Events()
    handle = first.start(trainer_plan(tmp_path, "kept"), events, Resources(1, 1, 0.01))
    assert handle == "gpus:0"
    assert visible_devices(events) == "0"
    process = events.processes[TRAINER]
    first.detach_all(timeout_s=scaled(10))  # the service stops; the run's process goes on

    restarted, adopted = LocalExecutor(host=GPU_HOST), Events()
    identity = process.identity
    record = ProcessRecord(TRAINER, identity.pid, identity.pgid, identity.start_time, process.log_path)
    try:
        assert restarted.adopt(trainer_plan(tmp_path, "kept"), adopted, handle, [record], starting=False)
        assert restarted.gpus.held("kept") == ("0",)
        other = Events()
        assert restarted.start(trainer_plan(tmp_path, "new"), other, Resources(1, 1, 0.01)) == "gpus:1"
        assert visible_devices(other) == "1"
        restarted.stop("new")
        assert other.done.wait(scaled(30))
    finally:
        restarted.stop("kept")
        assert adopted.done.wait(scaled(30))
    assert restarted.gpus.free() == ["0", "1"]
    # A run that was still starting when the service went fails (its start-up died with it) and holds nothing.
    interrupted = Events()
    assert restarted.adopt(trainer_plan(tmp_path, "half"), interrupted, "gpus:1", [], starting=True)
    assert interrupted.outcome is not None and interrupted.outcome.failure is not None
    assert interrupted.outcome.failure.kind == "startup_error"
    assert restarted.gpus.free() == ["0", "1"]


# --- on a Ray node ---


def test_a_ray_run_hands_its_processes_the_gpus_ray_assigned_to_its_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert assigned_gpus(1, {"CUDA_VISIBLE_DEVICES": "3"}) == {"CUDA_VISIBLE_DEVICES": "3"}
    assert assigned_gpus(0, {}) == {"CUDA_VISIBLE_DEVICES": ""}, "Ray sets nothing for a job without GPUs"
    assert assigned_gpus(0, {"CUDA_VISIBLE_DEVICES": "0,1"}) == {"CUDA_VISIBLE_DEVICES": ""}
    assert assigned_gpus(2, {}) == {}, "nothing assigned: nothing to hand on"

    entry = {
        "role": TRAINER,
        "argv": ["@RLCTL_PYTHON@", "-m", "rlctl.trainer"],
        "env": {"CUDA_VISIBLE_DEVICES": "7", "PYTHONUNBUFFERED": "1"},  # whatever the plan says, Ray decides
        "cwd": "@RLCTL_REPO@",
        "log_path": "@RLCTL_DATA@/trainer.log",
        "ready": {},
        "ready_timeout_s": 5,
    }
    layout = NodeLayout(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")  # as Ray set it for the job's entrypoint
    [spec] = node_process_specs(layout, {"gpus": 2, "processes": [entry]})
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "2,5" and spec.env["PYTHONUNBUFFERED"] == "1"
    [spec] = node_process_specs(layout, {"gpus": 0, "processes": [entry]})
    assert spec.env["CUDA_VISIBLE_DEVICES"] == ""
