"""The runs this replica supervises: admit, start, stop, re-adopt after a restart, heartbeat, metrics ingestion.

The executor (rlctl/supervisor/executor.py, chosen by RLCTL_EXECUTOR) runs the processes; this module turns its events
into database records and decides admission (rlctl/service/runs/admission.py). Every state change is a compare-and-set
(rlctl/service/runs/lifecycle.py), so two actors never both win.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select, update

from rlctl.service.context import AppContext, Component
from rlctl.service.db.models import Run, RunProcess
from rlctl.service.db.types import utcnow
from rlctl.service.environments.catalog import EnvironmentCatalog
from rlctl.service.errors import Conflict
from rlctl.service.runs import admission, lifecycle, metrics, mixture
from rlctl.service.runs.launch import Ports, process_specs
from rlctl.service.runs.paths import RunPaths
from rlctl.service.runs.tiny_model import TinyModelBuilder
from rlctl.service.runs.wandb import run_wandb_mode
from rlctl.service.states import ProcessStatus, RunStatus
from rlctl.supervisor.executor import Executor, ProcessRecord
from rlctl.supervisor.local import LocalExecutor
from rlctl.supervisor.process import ExitStatus, ProcessSpec, SupervisedProcess
from rlctl.supervisor.run import TRAINER, Failure, Outcome, RunPlan

logger = logging.getLogger("rlctl.runs")


class ExecutorUnavailable(RuntimeError):
    """RLCTL_EXECUTOR names an executor this service cannot use: the service does not start."""


def build_executor(ctx: AppContext) -> Executor:
    """The executor RLCTL_EXECUTOR names (docs/RUNS.md#executors, docs/RAY.md)."""
    settings = ctx.settings
    if settings.executor == "local":
        return LocalExecutor(max_runs=settings.max_concurrent_runs, fork_server=ctx.children.fork_server)
    if not settings.ray_address or not settings.ray_control_url:
        raise ExecutorUnavailable(
            "RLCTL_EXECUTOR=ray needs RLCTL_RAY_ADDRESS (the Ray dashboard's address) and RLCTL_RAY_CONTROL_URL "
            "(this control plane's URL as the Ray nodes reach it): docs/RAY.md"
        )
    from rlctl.service.runs.node import issue_bootstrap_secret
    from rlctl.supervisor.ray_executor import RayExecutor

    data_path = settings.data_path
    return RayExecutor(
        address=settings.ray_address,
        control_url=settings.ray_control_url,
        issue_secret=lambda run_id: issue_bootstrap_secret(ctx, run_id),
        log_path=lambda run_id, role: RunPaths(data_path, run_id).log(role),
        node_python=settings.ray_node_python,
    )


class RunManager(Component):
    def __init__(self, ctx: AppContext, executor: Executor | None = None) -> None:
        self.ctx = ctx
        self.replica_id = ctx.replica_id
        self.executor = executor or build_executor(ctx)
        self._closing = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._environment_file_for: Callable[[str], Path] = lambda name: EnvironmentCatalog.of(ctx).get(name).file_path

    # --- service lifecycle ---

    def open(self) -> None:
        self.recover()
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="runs-heartbeat", daemon=True)
        self._heartbeat.start()

    def close(self) -> None:
        """Stop watching; the runs' processes keep running and the next service start re-adopts them."""
        self._closing.set()
        self.executor.detach_all(timeout_s=30)
        if self._heartbeat:
            self._heartbeat.join(timeout=30)

    # --- runs ---

    def admit(self) -> list[str]:
        """Start the waiting runs that fit now (pending or queued → starting), queue the others; the ids started.

        Called when a run is accepted, when one ends or a queued one is stopped (a slot frees), at start-up and at
        every heartbeat (free memory changes by itself)."""
        started: list[str] = []
        if not self._anything_waits():
            return started  # the usual case: no decision, no lock taken
        while not self._closing.is_set():
            with self.ctx.db.session() as session:
                admitted = admission.admit(session, self.executor, self.replica_id)
            if not admitted:
                break
            # A run that fails before any process starts frees its slot at once: decide again.
            launched = [run_id for run_id in admitted if self._start(run_id)]
            started += launched
            if len(launched) == len(admitted):
                break
        return started

    def _anything_waits(self) -> bool:
        """Has this replica a run waiting? A run that starts waiting later is admitted by its own creator's call."""
        with self.ctx.db.read() as session:
            waiting = select(Run.id).where(Run.owner_id == self.replica_id, Run.status.in_(lifecycle.WAITING))
            return session.scalar(waiting.limit(1)) is not None

    def _start(self, run_id: str) -> bool:
        """Start an admitted (`starting`) run's processes in the background; False when it failed at once."""
        with self.ctx.db.read() as session:
            run = session.get(Run, run_id)
            if run is not None and run.status == lifecycle.STOPPING:
                # Stopped between its admission and its start: nothing was started, so it is stopped now.
                with self.ctx.db.session() as writing:
                    lifecycle.transition(writing, run_id, lifecycle.STOPPED)
                return False  # its slot is free again
            if run is None or run.status != lifecycle.STARTING:
                return True
            environment, backend, ports = run.environment, run.backend, Ports(**run.ports)
            config = run.config
            wandb_mode = run_wandb_mode(self.ctx.settings, run.wandb)
            resources = admission.run_resources(run)
        paths = RunPaths(self.ctx.settings.data_path, run_id)
        try:
            environment_file = self._environment_file_for(environment)
            members = mixture.launch_members(config, paths.run_dir, self._environment_file_for)
            specs = process_specs(self.ctx.settings, paths, ports, environment_file, backend, wandb_mode, members)
        except Exception as exc:  # noqa: BLE001 - a run that cannot be planned fails with the reason
            self._fail_before_start(run_id, f"{type(exc).__name__}: {exc}")
            return False
        events = _PersistingEvents(self, run_id, paths)
        plan = self._plan(run_id, paths, specs, events)
        plan.prepare = self._preparation(backend)
        handle = self.executor.start(plan, events, resources)
        if handle is not None:
            with self.ctx.db.session() as session:
                session.execute(update(Run).where(Run.id == run_id).values(executor_handle=handle))
        return True

    def request_stop(self, run_id: str) -> str:
        """Ask a run to stop; returns the state it moved to. The owner's executor does the stopping."""
        with self.ctx.db.session() as session:
            run = session.get(Run, run_id)
            if run is None:
                raise Conflict("run vanished")
            waiting = run.status in lifecycle.WAITING
            if waiting and lifecycle.transition(session, run_id, lifecycle.STOPPED):
                stopped = True
            else:
                stopped = False
                moved = lifecycle.transition(session, run_id, lifecycle.STOPPING)
                status = lifecycle.STOPPING if moved else session.get_one(Run, run_id).status
        if stopped:
            # Nothing was started. The runs behind it move up; one it blocked may fit now.
            self.admit()
            return lifecycle.STOPPED
        self.executor.stop(run_id)
        return status

    # --- restart safety ---

    def recover(self) -> None:
        """Re-adopt this replica's started runs (or finish them with a reason), then admit the waiting ones: the
        queue lives in the database, so queued runs stay queued across a restart and start as slots free."""
        with self.ctx.db.session() as session:
            runs = session.scalars(select(Run).where(Run.status.in_(lifecycle.ADMITTED))).all()
            owned = [(r.id, r.status, r.owner_id, r.executor_handle) for r in runs]
        for run_id, status, owner, handle in owned:
            if owner not in (None, self.replica_id):
                continue  # another replica's: the stale-owner sweep handles it
            try:
                self._recover_started(run_id, status, handle)
            except Exception:  # noqa: BLE001 - one bad record must not stop the others' recovery
                logger.exception("run %s: recovery failed; left unchanged", run_id)
        self._finish_runs_of_dead_replicas()
        self.admit()

    def _recover_started(self, run_id: str, status: str, handle: str | None) -> None:
        paths = RunPaths(self.ctx.settings.data_path, run_id)
        with self.ctx.db.session() as session:
            rows = session.scalars(select(RunProcess).where(RunProcess.run_id == run_id)).all()
            records = [process_record(r, paths.log(r.role)) for r in rows]
        events = _PersistingEvents(self, run_id, paths)
        plan = self._plan(run_id, paths, [], events)
        if not self.executor.adopt(plan, events, handle, records, starting=status == lifecycle.STARTING):
            logger.warning("run %s: its state cannot be told now; changing nothing", run_id)
            return
        if status == lifecycle.STOPPING:
            self.executor.stop(run_id)

    def _finish_runs_of_dead_replicas(self) -> None:
        """Runs whose owner stopped heartbeating end with a reason; their processes are not ours to signal."""
        stale_before = utcnow() - timedelta(seconds=self.ctx.settings.replica_stale_after_s)
        with self.ctx.db.session() as session:
            stale = session.scalars(
                select(Run).where(
                    Run.status.in_(lifecycle.ADMITTED),
                    Run.owner_id.is_not(None),
                    Run.owner_id != self.replica_id,
                    Run.heartbeat_at < stale_before,
                )
            ).all()
            for run in stale:
                message = f"replica {run.owner_id} stopped heartbeating at {run.heartbeat_at:%Y-%m-%dT%H:%M:%SZ}"
                failure = Failure("owner_lost", message).to_dict()
                lifecycle.transition(session, run.id, lifecycle.FAILED, failure=failure)

    def _heartbeat_loop(self) -> None:
        while not self._closing.wait(self.ctx.settings.heartbeat_interval_s):
            try:
                with self.ctx.db.session() as session:
                    session.execute(
                        update(Run)
                        .where(Run.owner_id == self.replica_id, Run.status.in_(lifecycle.ACTIVE))
                        .values(heartbeat_at=utcnow())
                    )
                self._finish_runs_of_dead_replicas()
                self.admit()  # a run waiting for memory may fit now
            except Exception:  # noqa: BLE001 - a database hiccup must not end the heartbeat
                logger.exception("heartbeat failed")

    # --- plans ---

    def _plan(self, run_id: str, paths: RunPaths, specs: list[ProcessSpec], events: _PersistingEvents) -> RunPlan:
        settings = self.ctx.settings
        return RunPlan(
            run_id=run_id,
            specs=specs,
            progress=lambda: events.trainer_step,  # read by the tick just before: no second read
            finished_steps=lambda role: _finished_steps(paths, role),
            reported_failure=lambda role: _reported_failure(paths, role),
            scrub=self.ctx.scrub,
            stop_grace_s=settings.stop_grace_s,
            poll_interval_s=settings.monitor_interval_s,
            stall_after_s=settings.stall_after_s,
            drain_timeout_s=settings.drain_timeout_s,
        )

    def _preparation(self, backend: str) -> Callable[[], None] | None:
        """The local backend's default model is built before the trainer and env load it: in a child process,
        once (a build the start-up began is waited for, docs/RUNS.md#start-up-work)."""
        if backend != "local" or self.ctx.settings.local_base_model:
            return None
        tiny_model = TinyModelBuilder.of(self.ctx)

        def prepare() -> None:
            tiny_model.ensure()

        return prepare

    def _fail_before_start(self, run_id: str, message: str) -> None:
        failure = Failure("startup_error", self.ctx.scrub(message)).to_dict()
        with self.ctx.db.session() as session:
            lifecycle.transition(session, run_id, lifecycle.FAILED, failure=failure)


def process_record(process: RunProcess, log_path: Path) -> ProcessRecord:
    """A recorded process as the executor reads it (rlctl/supervisor/executor.py); `log_path` when none is recorded."""
    exited = ExitStatus(process.exit_code, process.signal) if process.status == ProcessStatus.EXITED else None
    return ProcessRecord(
        role=process.role,
        pid=process.pid,
        pgid=process.pgid,
        start_time=process.start_time,
        log_path=Path(process.log_path) if process.log_path else log_path,
        exited=exited,
    )


def _finished_steps(paths: RunPaths, role: str) -> bool | None:
    if role != TRAINER:
        return None
    state = paths.read_trainer_state()
    if state is None:
        return None
    return state.get("status") == "completed"


def _reported_failure(paths: RunPaths, role: str) -> tuple[str, str] | None:
    """The failure kind the trainer wrote when a failure budget ran out (docs/TRAINER.md#failure-budgets)."""
    if role != TRAINER:
        return None
    state = paths.read_trainer_state() or {}
    kind = state.get("failure_kind")
    if state.get("status") != "failed" or not isinstance(kind, str):
        return None
    return kind, str(state.get("error") or kind)


class _PersistingEvents:
    """Supervisor events → database rows (process identities, states, metrics, failure reasons)."""

    def __init__(self, manager: RunManager, run_id: str, paths: RunPaths) -> None:
        self.manager = manager
        self.db = manager.ctx.db
        self.run_id = run_id
        self.paths = paths
        self.cursors = metrics.MetricsCursors()
        self.trainer_step: int | None = None  # from trainer_state.json at the last tick

    def process_started(self, process: SupervisedProcess) -> None:
        with self.db.session() as session:
            row = session.scalars(
                select(RunProcess).where(RunProcess.run_id == self.run_id, RunProcess.role == process.role)
            ).one_or_none()
            if row is None:
                row = RunProcess(run_id=self.run_id, role=process.role)
                session.add(row)
            row.pid, row.pgid = process.identity.pid, process.identity.pgid
            row.start_time, row.log_path = process.identity.start_time, str(process.log_path)
            row.status, row.started_at = ProcessStatus.RUNNING, utcnow()

    def running(self) -> None:
        with self.db.session() as session:
            lifecycle.transition(session, self.run_id, lifecycle.RUNNING)

    def process_exited(self, process: SupervisedProcess, status: ExitStatus | None) -> None:
        with self.db.session() as session:
            session.execute(
                update(RunProcess)
                .where(RunProcess.run_id == self.run_id, RunProcess.role == process.role)
                .values(
                    status=ProcessStatus.EXITED,
                    exit_code=status.code if status else None,
                    signal=status.signal if status else None,
                    ended_at=utcnow(),
                )
            )

    def stall_changed(self, stalled: bool, idle_s: float) -> None:
        if stalled:
            logger.warning("run %s: no training progress for %.0f s", self.run_id, idle_s)
        with self.db.session() as session:
            session.execute(update(Run).where(Run.id == self.run_id).values(stalled=stalled))

    def tick(self) -> None:
        try:
            self._sync()
        except Exception:  # noqa: BLE001 - ingestion retries next tick; supervision goes on
            logger.exception("run %s: metrics ingestion failed", self.run_id)

    def finished(self, outcome: Outcome) -> None:
        self._sync()
        failure = outcome.failure.to_dict() if outcome.failure else None
        with self.db.session() as session:
            lifecycle.transition(session, self.run_id, RunStatus(outcome.status), failure=failure, stalled=False)
        self.manager.admit()  # its slot is free

    def _sync(self) -> None:
        state = self.paths.read_trainer_state() or {}
        self.trainer_step = state.get("step")
        with self.db.session() as session:
            step = metrics.ingest(session, self.paths, self.cursors)
            run = session.get(Run, self.run_id)
            if run is None:
                return
            if step is not None and (run.last_step is None or step > run.last_step):
                run.last_step = step
            run.wandb_url = state.get("wandb_url") or run.wandb_url
            run.weights = state.get("weights") or run.weights
            stop_requested = run.status == lifecycle.STOPPING
        if stop_requested:
            self.manager.executor.stop(self.run_id)
