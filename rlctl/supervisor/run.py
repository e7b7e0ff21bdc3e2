"""A run's three processes: each spawned once the roles it waits for are ready (docs/RUNS.md#process-order),
watched together, stopped in reverse order.

Fate sharing (docs/RUNS.md#fate-sharing): when the trainer ends, the run ends (completed when it finished its
steps, failed otherwise); when the API ends, the run fails; when the environment exits with code 0, the trainer
drains the queued batches and the run ends as the trainer does, or fails if it does not within the drain
time-out; an environment killed by a signal or exiting non-zero fails the run at once, naming the environment.
A stop request, also during start-up, stops whatever was started. The caller receives events and keeps the
records.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from rlctl.supervisor.forkserver import ForkServer
from rlctl.supervisor.process import ExitStatus, ProcessSpec, SupervisedProcess
from rlctl.supervisor.readiness import (
    READINESS_PROBE_INTERVAL_S,
    ExitedDuringStartup,
    ReadinessTimeout,
    StartupCancelled,
    is_ready,
)

logger = logging.getLogger("rlctl.supervisor")

API, TRAINER, ENV = "api", "trainer", "env"
START_ORDER = (API, TRAINER, ENV)
LOG_TAIL_LINES = 40

OutcomeStatus = Literal["completed", "stopped", "failed"]


@dataclass(frozen=True)
class Failure:
    # process_exited | readiness_timeout | startup_error | drain_timeout, or the kind a process reported
    # (sampling_failed, training_failed, collapsed, unsupported_batch) (docs/RUNS.md#failure-kinds)
    kind: str
    message: str
    process: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    log_tail: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Outcome:
    status: OutcomeStatus
    failure: Failure | None = None


class RunEvents(Protocol):
    def process_started(self, process: SupervisedProcess) -> None: ...
    def running(self) -> None: ...
    def process_exited(self, process: SupervisedProcess, status: ExitStatus | None) -> None: ...
    def stall_changed(self, stalled: bool, idle_s: float) -> None: ...
    def tick(self) -> None: ...
    def finished(self, outcome: Outcome) -> None: ...


@dataclass
class RunPlan:
    run_id: str
    specs: list[ProcessSpec]  # in start order
    progress: Callable[[], object]  # changes whenever training advances (e.g. the last step)
    finished_steps: Callable[[str], bool | None]  # did this role finish its work? None: cannot tell
    # The (kind, message) a role reported for its own failure (the trainer's failure budgets); None: none.
    reported_failure: Callable[[str], tuple[str, str] | None] = lambda role: None
    scrub: Callable[[str], str] = lambda text: text
    stop_grace_s: float = 10.0
    poll_interval_s: float = 1.0
    stall_after_s: float | None = None
    drain_timeout_s: float = 600.0
    prepare: Callable[[], None] | None = None  # work before the first spawn (e.g. build a local model)


class RunSupervisor:
    def __init__(self, plan: RunPlan, events: RunEvents, fork_server: ForkServer | None = None) -> None:
        self.plan = plan
        self.events = events
        self.fork_server = fork_server  # the processes are forked from it where it can (rlctl/supervisor/forkserver.py)
        self.processes: dict[str, SupervisedProcess] = {}
        self._stop = threading.Event()
        self._detach = threading.Event()
        self._reported: set[str] = set()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._launch(adopted=None)

    def adopt(self, processes: dict[str, SupervisedProcess]) -> None:
        """Watch processes started by an earlier service process (already running)."""
        self._launch(adopted=processes)

    def stop(self) -> None:
        """Ask for a stop (also cancels a start-up in progress); returns at once."""
        self._stop.set()

    def detach(self) -> None:
        """Stop watching but leave the processes running (service shutdown: the next start re-adopts them)."""
        self._detach.set()
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _launch(self, adopted: dict[str, SupervisedProcess] | None) -> None:
        self._thread = threading.Thread(
            target=self._supervise, args=(adopted,), name=f"run-{self.plan.run_id}", daemon=True
        )
        self._thread.start()

    def _supervise(self, adopted: dict[str, SupervisedProcess] | None) -> None:
        outcome = Outcome("failed", Failure("startup_error", "supervision ended unexpectedly"))
        try:
            if adopted is None:
                self._start_all()
                self.events.running()
            else:
                self.processes = dict(adopted)
            outcome = self._watch()
        except StartupCancelled:
            if self._detach.is_set():
                return

            outcome = Outcome("stopped")
        except ReadinessTimeout as exc:
            outcome = self._failed("readiness_timeout", str(exc), exc.role)
        except ExitedDuringStartup as exc:
            outcome = self._failed("process_exited", str(exc), exc.role, exc.status)
        except Exception as exc:  # noqa: BLE001 - any start-up error ends the run with its reason
            logger.exception("run %s: start-up error", self.plan.run_id)
            outcome = self._failed("startup_error", f"{type(exc).__name__}: {exc}")
        except BaseException:
            self._stop_all()
            raise
        if self._detach.is_set():
            return  # processes keep running; nothing is finished
        self._stop_all()
        self.events.finished(outcome)

    def _start_all(self) -> None:
        """Spawn each process once the roles it waits for are ready (its spec's `after`), then wait until every
        one is ready. A process that exits before it is ready, or is not ready within its time-out (counted from
        its spawn), ends the start-up; so does a stop, and nothing more is spawned."""
        if self.plan.prepare is not None:
            self.plan.prepare()
        specs = self.plan.specs
        waits_for = _dependencies(specs)
        pending = list(specs)
        ready: set[str] = set()
        deadlines: dict[str, float] = {}
        while len(ready) < len(specs):
            if self._stop.is_set():
                raise StartupCancelled()
            for spec in [s for s in pending if waits_for[s.role] <= ready]:
                if self._stop.is_set():
                    raise StartupCancelled()
                process = SupervisedProcess.spawn(spec, self.fork_server)
                self.processes[spec.role] = process
                self.events.process_started(process)
                deadlines[spec.role] = time.monotonic() + spec.ready_timeout_s
                pending.remove(spec)
            became_ready = False
            for spec in specs:
                if spec.role in ready or spec.role not in self.processes:
                    continue
                if not set(spec.probe_after) & set(waits_for) <= ready:
                    status = self.processes[spec.role].poll()  # not probed yet, but an exit is seen at once
                    if status is not None:
                        raise ExitedDuringStartup(spec.role, status)
                    if time.monotonic() >= deadlines[spec.role]:
                        raise ReadinessTimeout(spec.role, spec.ready_timeout_s)
                    continue
                if is_ready(self.processes[spec.role], spec.ready, deadlines[spec.role], spec.ready_timeout_s):
                    ready.add(spec.role)
                    became_ready = True
            if not became_ready and len(ready) < len(specs):
                self._stop.wait(READINESS_PROBE_INTERVAL_S)

    def _watch(self) -> Outcome:
        progress, progress_at = self.plan.progress(), time.monotonic()
        stalled = False
        drain_started: float | None = None
        while not self._stop.is_set():
            self.events.tick()
            statuses = {role: process.poll() for role, process in self.processes.items()}
            for role, status in statuses.items():
                if status is not None:
                    self._report_exit(role, status)
            if (outcome := self._fate(statuses)) is not None:
                return outcome
            if statuses.get(ENV) is not None and drain_started is None:
                logger.info("run %s: environment finished; the trainer drains queued batches", self.plan.run_id)
                drain_started = time.monotonic()
            if drain_started is not None and time.monotonic() - drain_started > self.plan.drain_timeout_s:
                message = f"the trainer did not finish within {self.plan.drain_timeout_s:g} s of the environment"
                return self._failed("drain_timeout", message, TRAINER)
            current = self.plan.progress()
            if current != progress:
                progress, progress_at = current, time.monotonic()
                if stalled:
                    stalled = False
                    self.events.stall_changed(False, 0.0)
            idle = time.monotonic() - progress_at
            if not stalled and self.plan.stall_after_s is not None and idle > self.plan.stall_after_s:
                stalled = True
                self.events.stall_changed(True, idle)
            self._stop.wait(self.plan.poll_interval_s)
        return Outcome("stopped")

    def _fate(self, statuses: dict[str, ExitStatus | None]) -> Outcome | None:
        trainer, api, env = statuses.get(TRAINER), statuses.get(API), statuses.get(ENV)
        if trainer is not None:
            return self._trainer_outcome(trainer)
        if api is not None:
            return self._failed("process_exited", f"api {api.describe()}", API, api)
        if env is not None and not _may_drain(env):
            return self._failed("process_exited", f"env {env.describe()}", ENV, env)
        return None

    def _trainer_outcome(self, status: ExitStatus) -> Outcome:
        finished = self.plan.finished_steps(TRAINER)
        if status.code == 0 and finished is not False:
            return Outcome("completed")
        if status.code is None and status.signal is None and finished:
            return Outcome("completed")
        message = f"trainer {status.describe()}"
        if status.code == 0:
            message += " before finishing its steps"
        reported = self.plan.reported_failure(TRAINER) if status.code != 0 else None
        if reported is not None:
            kind, reason = reported
            return self._failed(kind, f"{message}: {reason}", TRAINER, status)
        return self._failed("process_exited", message, TRAINER, status)

    def _failed(self, kind: str, message: str, role: str | None = None, status: ExitStatus | None = None) -> Outcome:
        tail = self._log_tail(role) if role else []
        failure = Failure(
            kind=kind,
            message=self.plan.scrub(message),
            process=role,
            exit_code=status.code if status else None,
            signal=status.signal if status else None,
            log_tail=tail,
        )
        return Outcome("failed", failure)

    def _log_tail(self, role: str) -> list[str]:
        process = self.processes.get(role)
        path = process.log_path if process else next((s.log_path for s in self.plan.specs if s.role == role), None)
        return [self.plan.scrub(line) for line in read_tail(path, LOG_TAIL_LINES)] if path else []

    def _stop_all(self) -> None:
        for role in reversed(START_ORDER):
            process = self.processes.get(role)
            if process is None:
                continue
            status = process.terminate(self.plan.stop_grace_s)
            self._report_exit(role, status)

    def _report_exit(self, role: str, status: ExitStatus | None) -> None:
        if role in self._reported:
            return
        self._reported.add(role)
        self.events.process_exited(self.processes[role], status)


def _dependencies(specs: list[ProcessSpec]) -> dict[str, set[str]]:
    """The roles each process waits for: its `after`, else the process before it; roles not in the plan are
    not waited for."""
    roles = {spec.role for spec in specs}
    waits_for: dict[str, set[str]] = {}
    for index, spec in enumerate(specs):
        after = spec.after if spec.after is not None else ((specs[index - 1].role,) if index else ())
        waits_for[spec.role] = set(after) & roles
    return waits_for


def _may_drain(status: ExitStatus) -> bool:
    """Only a clean end of the environment lets the trainer drain: exit code 0, or an exit seen out of sight
    (an adopted process, code and signal both unknown). A signal death is never clean, whatever the signal."""
    if status.signal is not None:
        return False
    return status.code in (0, None)


def read_tail(path: Path, lines: int) -> list[str]:
    """The last lines of a log file, reading backwards from its end only as far as needed."""
    chunk = 64 * 1024
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            position = handle.tell()
            data = b""
            while position > 0 and data.count(b"\n") <= lines:
                step = min(chunk, position)
                position -= step
                handle.seek(position)
                data = handle.read(step) + data
    except OSError:
        return []
    return data.decode("utf-8", errors="replace").splitlines()[-lines:] if lines > 0 else []
