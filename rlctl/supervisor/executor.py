"""The executor interface: where a run's three processes live, and how they are started, stopped, watched, read
and re-attached (docs/RUNS.md#executors).

The run lifecycle (rlctl/service/runs/manager.py) drives exactly one executor, chosen by RLCTL_EXECUTOR: `local`
(rlctl/supervisor/local.py: children of the service's own host, the default) or `ray`. An executor knows nothing of
HTTP or of the database: it receives a plan (rlctl/supervisor/run.py RunPlan), reports what happens through the plan's
events (RunEvents), and hands back a handle for the caller to store with the run (a Ray submission id; None for
the local executor, whose processes are recognised by the identities the events report).

Admission (the queue) is the caller's, decided in the database; the executor only says what it can hold
(`fits`) and what it can never hold (`refusal`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from rlctl.supervisor.process import ExitStatus, Liveness
from rlctl.supervisor.run import RunEvents, RunPlan


@dataclass(frozen=True)
class Resources:
    """What one run asks for: CPU cores, whole GPUs, and memory in GB (10^9 bytes)."""

    cpus: float
    gpus: int
    memory_gb: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Resources:
        return cls(float(values["cpus"]), int(values["gpus"]), float(values["memory_gb"]))

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpus + other.cpus, self.gpus + other.gpus, self.memory_gb + other.memory_gb)


NO_RESOURCES = Resources(0.0, 0, 0.0)


@dataclass(frozen=True)
class ProcessRecord:
    """One process of a run as the caller recorded it from `RunEvents.process_started` (and `process_exited`):
    enough for the executor to recognise it again after a restart of the service."""

    role: str
    pid: int | None
    pgid: int | None
    start_time: float | None
    log_path: Path
    exited: ExitStatus | None = None  # the exit already recorded; None while it was running


@dataclass(frozen=True)
class Usage:
    """What the executor's admitted runs hold now (the caller counts them from its records)."""

    runs: int
    resources: Resources
    starting: Resources  # of those, the runs still starting: their memory is not yet used, only promised


class Executor(ABC):
    """One executor per service process. Every method returns promptly; the supervision runs in the background."""

    name: ClassVar[str]

    @abstractmethod
    def start(self, plan: RunPlan, events: RunEvents, resources: Resources) -> str | None:
        """Start the run's processes in the background with today's readiness, stop order, grace and fate-sharing
        rules (rlctl/supervisor/run.py), reporting through `events` until `events.finished`. Returns the handle to store
        with the run (e.g. a Ray submission id), or None when the executor needs none."""

    @abstractmethod
    def adopt(
        self,
        plan: RunPlan,
        events: RunEvents,
        handle: str | None,
        processes: Sequence[ProcessRecord],
        starting: bool,
    ) -> bool:
        """Watch again a run that an earlier service process started (after a restart), by its stored `handle`
        and `processes`. `starting`: the run was still starting then; its start-up died with that process, so
        whatever was started is stopped and the run fails (`events.finished`). Returns False, changing nothing,
        when the run's state cannot be told now (e.g. no permission to see a process)."""

    @abstractmethod
    def stop(self, run_id: str) -> None:
        """Ask a run to stop (also cancels a start-up in progress); returns at once. The outcome arrives through
        `events.finished`. A run this executor does not watch is left alone."""

    @abstractmethod
    def status(self, run_id: str, process: ProcessRecord) -> Liveness:
        """Is this recorded process alive now (a reused pid counts as dead; unreadable is UNKNOWN)?"""

    @abstractmethod
    def logs(self, run_id: str, role: str, log_path: Path, lines: int) -> list[str]:
        """The last `lines` lines of a process's log, unscrubbed (the caller scrubs secrets)."""

    @abstractmethod
    def detach_all(self, timeout_s: float) -> None:
        """Service shutdown: stop watching, leave every run running (the next start adopts them)."""

    @abstractmethod
    def has_gpus(self) -> bool:
        """Does the executor have GPUs at all (a `local`-backend run then asks for one by default)?"""

    @abstractmethod
    def refusal(self, resources: Resources) -> str | None:
        """Why a run asking for `resources` could never start here (more than the executor ever has), or None."""

    @abstractmethod
    def fits(self, resources: Resources, usage: Usage) -> bool:
        """Can a run asking for `resources` start now, beside what the admitted runs hold (`usage`)?"""
