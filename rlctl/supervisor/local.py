"""The `local` executor: a run's three processes are children of the service's own host (docs/RUNS.md#executors).

Each run is one RunSupervisor thread (rlctl/supervisor/run.py). Its limits: RLCTL_MAX_CONCURRENT_RUNS admitted runs at
once, the host's GPUs, and the host's free memory (what the kernel reports available, less what the runs still
starting have been promised but not yet taken). CPU cores are not a limit: runs share them.

GPUs are assigned, not only counted: on a host with GPUs each run gets the lowest free GPU ids it asked for (none
for a run that asked for none), and its processes see exactly those (CUDA_VISIBLE_DEVICES), so concurrent runs
never share a GPU. The assignment is the run's handle (`gpus:0,1`), stored with the run, so a restarted service
holds the same GPUs for the runs it re-adopts.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from rlctl.supervisor.executor import Executor, ProcessRecord, Resources, Usage
from rlctl.supervisor.forkserver import ForkServer
from rlctl.supervisor.process import (
    VISIBLE_DEVICES,
    ExitStatus,
    Liveness,
    ProcessIdentity,
    SupervisedProcess,
    identity_liveness,
)
from rlctl.supervisor.run import START_ORDER, Failure, Outcome, RunEvents, RunPlan, RunSupervisor, read_tail

logger = logging.getLogger("rlctl.supervisor")

GB = 1_000_000_000
NVIDIA_GPUS_DIR = Path("/proc/driver/nvidia/gpus")  # one entry per GPU the NVIDIA driver sees
GPU_HANDLE_PREFIX = "gpus:"


@dataclass(frozen=True)
class Host:
    """What this machine has: cores, GPUs (and the ids CUDA knows them by), total memory."""

    cpus: int
    gpus: int
    memory_gb: float
    gpu_ids: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.gpu_ids:
            object.__setattr__(self, "gpu_ids", tuple(str(index) for index in range(self.gpus)))
        elif len(self.gpu_ids) != self.gpus:
            raise ValueError(f"{self.gpus} GPUs but {len(self.gpu_ids)} GPU ids: {self.gpu_ids}")

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None) -> Host:
        ids = host_gpu_ids(os.environ if environ is None else environ, count_gpus())
        return cls(os.cpu_count() or 1, len(ids), psutil.virtual_memory().total / GB, ids)


def host_gpu_ids(environ: Mapping[str, str], driver_gpus: int) -> tuple[str, ...]:
    """The GPUs this service may hand out, as CUDA names them: those its own CUDA_VISIBLE_DEVICES lists when set
    (an operator's restriction, or an empty value: none), else every GPU the driver sees (0, 1, ...)."""
    listed = environ.get(VISIBLE_DEVICES)
    if listed is None:
        return tuple(str(index) for index in range(driver_gpus))
    return tuple(dict.fromkeys(part.strip() for part in listed.split(",") if part.strip()))


class GpuPool:
    """Which of the host's GPUs each run holds. Thread-safe; the lowest free ids go first."""

    def __init__(self, ids: Sequence[str]) -> None:
        self.ids = tuple(ids)
        self._held: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    def free(self) -> list[str]:
        with self._lock:
            return self._free()

    def _free(self) -> list[str]:
        taken = {gpu for ids in self._held.values() for gpu in ids}
        return [gpu for gpu in self.ids if gpu not in taken]

    def take(self, run_id: str, count: int) -> tuple[str, ...] | None:
        """`count` free GPUs for the run (the ones it holds already, if any); None when too few are free."""
        with self._lock:
            if run_id in self._held:
                return self._held[run_id]
            free = self._free()
            if count > len(free):
                return None
            self._held[run_id] = tuple(free[:count])
            return self._held[run_id]

    def hold(self, run_id: str, ids: Sequence[str]) -> tuple[str, ...]:
        """A re-adopted run's GPUs, as its handle recorded them (ids this host no longer has are left out)."""
        with self._lock:
            self._held[run_id] = tuple(gpu for gpu in ids if gpu in self.ids)
            return self._held[run_id]

    def release(self, run_id: str) -> None:
        with self._lock:
            self._held.pop(run_id, None)

    def held(self, run_id: str) -> tuple[str, ...] | None:
        with self._lock:
            return self._held.get(run_id)


def gpu_handle(ids: Sequence[str]) -> str:
    return GPU_HANDLE_PREFIX + ",".join(ids)


def parse_gpu_handle(handle: str | None) -> tuple[str, ...]:
    """The GPU ids a local run's handle names; none for no handle (a run without GPUs, or recorded before)."""
    if not handle or not handle.startswith(GPU_HANDLE_PREFIX):
        return ()
    return tuple(part for part in handle[len(GPU_HANDLE_PREFIX) :].split(",") if part)


def with_gpus(plan: RunPlan, ids: Sequence[str]) -> RunPlan:
    """The plan with each process seeing exactly these GPUs (an empty CUDA_VISIBLE_DEVICES: none)."""
    visible = ",".join(ids)
    return replace(plan, specs=[replace(spec, env={**spec.env, VISIBLE_DEVICES: visible}) for spec in plan.specs])


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

    def __init__(
        self, max_runs: int | None = None, host: Host | None = None, fork_server: ForkServer | None = None
    ) -> None:
        self.max_runs = max_runs  # None: no limit on the number of runs
        self.host = host or Host.detect()
        self.fork_server = fork_server  # runs' processes are forked from it (None: each started anew)
        self.gpus = GpuPool(self.host.gpu_ids)
        self._supervisors: dict[str, RunSupervisor] = {}
        self._lock = threading.Lock()

    # --- start, adopt, stop ---

    def start(self, plan: RunPlan, events: RunEvents, resources: Resources) -> str | None:
        """The processes' identities, reported by events.process_started, recognise them again; on a host with
        GPUs the handle names the GPUs the run was given (None on a host without, as before GPUs were assigned)."""
        if not self.host.gpus:
            self._watch(plan, events).start()
            return None
        ids = self.gpus.take(plan.run_id, resources.gpus)
        if ids is None:
            # Admission counted a GPU free that a re-adopted run of an older version still holds: say so.
            plan.prepare = _refuse(f"{resources.gpus} GPU(s) asked for; free now: {self.gpus.free() or 'none'}")
            self._watch(plan, events).start()
            return None
        self._watch(with_gpus(plan, ids), events).start()
        return gpu_handle(ids) if ids else None

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
        if ids := parse_gpu_handle(handle):
            self.gpus.hold(plan.run_id, ids)
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
        if resources.gpus > len(self.gpus.free()):
            return False  # held by a run whose record does not count them (re-adopted from an older version)
        return resources.memory_gb <= available_memory_gb() - usage.starting.memory_gb

    # --- inside ---

    def _watch(self, plan: RunPlan, events: RunEvents) -> RunSupervisor:
        supervisor = RunSupervisor(plan, _Forgetting(events, lambda: self._forget(plan.run_id)), self.fork_server)
        with self._lock:
            self._supervisors[plan.run_id] = supervisor
        return supervisor

    def _forget(self, run_id: str) -> None:
        with self._lock:
            self._supervisors.pop(run_id, None)
        self.gpus.release(run_id)

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


def _refuse(reason: str) -> Callable[[], None]:
    def refuse() -> None:
        raise RuntimeError(reason)

    return refuse
