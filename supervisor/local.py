"""The `local` executor: a run's three processes are children of the service's own host (docs/RUNS.md#executors).

Each run is one RunSupervisor thread (supervisor/run.py). Its limits: RLCTL_MAX_CONCURRENT_RUNS admitted runs at
once, the host's GPUs, and the host's free memory (what the kernel reports available, less what the runs still
starting have been promised but not yet taken). CPU cores are not a limit: runs share them.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from supervisor.executor import Executor, ProcessRecord, Resources, Usage
from supervisor.process import ExitStatus, Liveness, ProcessIdentity, SupervisedProcess, identity_liveness
from supervisor.run import START_ORDER, Failure, Outcome, RunEvents, RunPlan, RunSupervisor, read_tail

logger = logging.getLogger("rlctl.supervisor")

GB = 1_000_000_000
NVIDIA_GPUS_DIR = Path("/proc/driver/nvidia/gpus")  # one entry per GPU the NVIDIA driver sees


@dataclass(frozen=True)
class Host:
    """What this machine has: cores, GPUs, total memory."""

    cpus: int
    gpus: int
    memory_gb: float

    @classmethod
    def detect(cls) -> Host:
        return cls(os.cpu_count() or 1, count_gpus(), psutil.virtual_memory().total / GB)


def count_gpus() -> int:
    """NVIDIA GPUs the driver sees, without importing torch (the service never loads it)."""
    try:
        return sum(1 for _ in NVIDIA_GPUS_DIR.iterdir())
    except OSError:
        return 0


def available_memory_gb() -> float:
    return psutil.virtual_memory().available / GB


class LocalExecutor(Executor):
    name = "local"

    def __init__(self, max_runs: int | None = None, host: Host | None = None) -> None:
        self.max_runs = max_runs  # None: no limit on the number of runs
        self.host = host or Host.detect()
        self._supervisors: dict[str, RunSupervisor] = {}
        self._lock = threading.Lock()

    # --- start, adopt, stop ---

    def start(self, plan: RunPlan, events: RunEvents, resources: Resources) -> str | None:
        self._watch(plan, events).start()
        return None  # the processes' identities, reported by events.process_started, are the handle

    def adopt(
        self,
        plan: RunPlan,
        events: RunEvents,
        handle: str | None,
        processes: Sequence[ProcessRecord],
        starting: bool,
    ) -> bool:
        adopted: dict[str, SupervisedProcess] = {}
        for record in processes:
            if record.pid is None or record.start_time is None:
                continue
            identity = ProcessIdentity(record.pid, record.pgid or record.pid, record.start_time)
            if record.exited is None and identity_liveness(identity) is Liveness.UNKNOWN:
                logger.warning("run %s: cannot tell whether %s (pid %s) lives", plan.run_id, record.role, record.pid)
                return False
            adopted[record.role] = SupervisedProcess.adopt(record.role, identity, record.log_path, record.exited)
        if starting:
            self._fail_interrupted_startup(plan, events, adopted)
            return True
        logger.info("run %s: re-adopting %s", plan.run_id, sorted(adopted))
        self._watch(plan, events).adopt(adopted)
        return True

    def stop(self, run_id: str) -> None:
        with self._lock:
            supervisor = self._supervisors.get(run_id)
        if supervisor is not None:
            supervisor.stop()

    def detach_all(self, timeout_s: float) -> None:
        with self._lock:
            supervisors = list(self._supervisors.values())
        for supervisor in supervisors:
            supervisor.detach()
        for supervisor in supervisors:
            supervisor.join(timeout=timeout_s)

    # --- status, logs ---

    def status(self, run_id: str, process: ProcessRecord) -> Liveness:
        if process.exited is not None or process.pid is None or process.start_time is None:
            return Liveness.DEAD if process.exited is not None else Liveness.UNKNOWN
        return identity_liveness(ProcessIdentity(process.pid, process.pgid or process.pid, process.start_time))

    def logs(self, run_id: str, role: str, log_path: Path, lines: int) -> list[str]:
        return read_tail(log_path, lines)

    # --- admission ---

    def has_gpus(self) -> bool:
        return self.host.gpus > 0

    def refusal(self, resources: Resources) -> str | None:
        if resources.gpus > self.host.gpus:
            return f"{resources.gpus} GPU(s) asked for; this host has {self.host.gpus}"
        if resources.memory_gb > self.host.memory_gb:
            return f"{resources.memory_gb:g} GB of memory asked for; this host has {self.host.memory_gb:.1f} GB"
        if resources.cpus > self.host.cpus:
            return f"{resources.cpus:g} CPUs asked for; this host has {self.host.cpus}"
        return None

    def fits(self, resources: Resources, usage: Usage) -> bool:
        if self.max_runs is not None and usage.runs >= self.max_runs:
            return False
        if usage.resources.gpus + resources.gpus > self.host.gpus:
            return False
        return resources.memory_gb <= available_memory_gb() - usage.starting.memory_gb

    # --- inside ---

    def _watch(self, plan: RunPlan, events: RunEvents) -> RunSupervisor:
        supervisor = RunSupervisor(plan, _Forgetting(events, lambda: self._forget(plan.run_id)))
        with self._lock:
            self._supervisors[plan.run_id] = supervisor
        return supervisor

    def _forget(self, run_id: str) -> None:
        with self._lock:
            self._supervisors.pop(run_id, None)

    def _fail_interrupted_startup(
        self, plan: RunPlan, events: RunEvents, processes: dict[str, SupervisedProcess]
    ) -> None:
        """The start-up sequence died with the old service: its half-started processes go, the run fails."""
        for role in reversed(START_ORDER):
            if role in processes:
                events.process_exited(processes[role], processes[role].terminate(plan.stop_grace_s))
        message = "the service restarted while this run was starting; its processes were stopped"
        events.finished(Outcome("failed", Failure("startup_error", message)))


class _Forgetting:
    """The caller's events, and the executor forgets the run just before it hears `finished` (so a run admitted
    in that same call never finds its predecessor still counted as watched)."""

    def __init__(self, events: RunEvents, forget: Callable[[], None]) -> None:
        self._events = events
        self._forget = forget

    def process_started(self, process: SupervisedProcess) -> None:
        self._events.process_started(process)

    def running(self) -> None:
        self._events.running()

    def process_exited(self, process: SupervisedProcess, status: ExitStatus | None) -> None:
        self._events.process_exited(process, status)

    def stall_changed(self, stalled: bool, idle_s: float) -> None:
        self._events.stall_changed(stalled, idle_s)

    def tick(self) -> None:
        self._events.tick()

    def finished(self, outcome: Outcome) -> None:
        self._forget()
        self._events.finished(outcome)
