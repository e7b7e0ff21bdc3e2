"""The runs this replica supervises: start, stop, re-adopt after a restart, heartbeat, metrics ingestion.

The supervisor (supervisor/) runs the processes; this module turns its events into database records. Every
state change is a compare-and-set (service/runs/lifecycle.py), so two actors never both win.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select, update

from service.context import AppContext
from service.db.models import Run, RunProcess
from service.db.types import utcnow
from service.errors import Conflict
from service.runs import lifecycle, metrics
from service.runs.launch import Ports, process_specs
from service.runs.lifecycle import ProcessStatus, RunStatus
from service.runs.paths import RunPaths
from service.runs.wandb import run_wandb_mode
from supervisor.process import ExitStatus, Liveness, ProcessIdentity, ProcessSpec, SupervisedProcess, identity_liveness
from supervisor.run import START_ORDER, TRAINER, Failure, Outcome, RunPlan, RunSupervisor
from trainer.tiny_model import init_tiny_model

logger = logging.getLogger("rlctl.runs")


class RunManager:
    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.replica_id = ctx.replica_id
        self._supervisors: dict[str, RunSupervisor] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._environment_file_for: Callable[[str], Path] = lambda name: ctx.catalog.get(name).file_path

    # --- service lifecycle ---

    def open(self) -> None:
        self.recover()
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="runs-heartbeat", daemon=True)
        self._heartbeat.start()

    def close(self) -> None:
        """Stop watching; the runs' processes keep running and the next service start re-adopts them."""
        self._closing.set()
        with self._lock:
            supervisors = list(self._supervisors.values())
        for supervisor in supervisors:
            supervisor.detach()
        for supervisor in supervisors:
            supervisor.join(timeout=30)
        if self._heartbeat:
            self._heartbeat.join(timeout=30)

    # --- runs ---

    def launch(self, run_id: str) -> None:
        """Start a pending run's processes in the background (pending → starting → running)."""
        with self.ctx.db.session() as session:
            run = session.get(Run, run_id)
            if run is None or run.status != lifecycle.PENDING:
                return
            if not lifecycle.transition(session, run_id, lifecycle.STARTING, owner_id=self.replica_id):
                return
            environment, backend, ports = run.environment, run.backend, Ports(**run.ports)
            wandb_mode = run_wandb_mode(self.ctx.settings, run.wandb)
        paths = RunPaths(self.ctx.settings.data_path, run_id)
        try:
            environment_file = self._environment_file_for(environment)
            specs = process_specs(self.ctx.settings, paths, ports, environment_file, backend, wandb_mode)
        except Exception as exc:  # noqa: BLE001 - a run that cannot be planned fails with the reason
            self._fail_before_start(run_id, f"{type(exc).__name__}: {exc}")
            return
        events = _PersistingEvents(self, run_id, paths)
        plan = self._plan(run_id, paths, specs, events)
        plan.prepare = self._preparation(backend)
        supervisor = RunSupervisor(plan, events)
        with self._lock:
            self._supervisors[run_id] = supervisor
        supervisor.start()

    def request_stop(self, run_id: str) -> str:
        """Ask a run to stop; returns the state it moved to. The owner's supervisor does the stopping."""
        with self.ctx.db.session() as session:
            run = session.get(Run, run_id)
            if run is None:
                raise Conflict("run vanished")
            if run.status == lifecycle.PENDING and lifecycle.transition(session, run_id, lifecycle.STOPPED):
                return lifecycle.STOPPED
            moved = lifecycle.transition(session, run_id, lifecycle.STOPPING)
            status = lifecycle.STOPPING if moved else session.get_one(Run, run_id).status
        with self._lock:
            supervisor = self._supervisors.get(run_id)
        if supervisor is not None:
            supervisor.stop()
        return status

    def supervisor(self, run_id: str) -> RunSupervisor | None:
        with self._lock:
            return self._supervisors.get(run_id)

    # --- restart safety ---

    def recover(self) -> None:
        """Re-adopt this replica's live runs, finish dead ones, start accepted-but-unstarted ones."""
        with self.ctx.db.session() as session:
            runs = session.scalars(select(Run).where(Run.status.in_(lifecycle.ACTIVE))).all()
            owned = [(r.id, r.status, r.owner_id) for r in runs]
        for run_id, status, owner in owned:
            if owner not in (None, self.replica_id):
                continue  # another replica's: the stale-owner sweep handles it
            try:
                if status == lifecycle.PENDING:
                    self.launch(run_id)
                else:
                    self._recover_started(run_id, status)
            except Exception:  # noqa: BLE001 - one bad record must not stop the others' recovery
                logger.exception("run %s: recovery failed; left unchanged", run_id)
        self._finish_runs_of_dead_replicas()

    def _recover_started(self, run_id: str, status: str) -> None:
        paths = RunPaths(self.ctx.settings.data_path, run_id)
        with self.ctx.db.session() as session:
            rows = session.scalars(select(RunProcess).where(RunProcess.run_id == run_id)).all()
            records = [(r.role, r.pid, r.pgid, r.start_time, r.log_path, r.status, r.exit_code, r.signal) for r in rows]
        processes: dict[str, SupervisedProcess] = {}
        for role, pid, pgid, start_time, log_path, row_status, exit_code, exit_signal in records:
            if pid is None or start_time is None:
                continue
            identity = ProcessIdentity(pid, pgid or pid, start_time)
            exited = ExitStatus(exit_code, exit_signal) if row_status == ProcessStatus.EXITED else None
            if exited is None and identity_liveness(identity) is Liveness.UNKNOWN:
                logger.warning("run %s: cannot tell whether %s (pid %s) lives; changing nothing", run_id, role, pid)
                return
            processes[role] = SupervisedProcess.adopt(role, identity, Path(log_path or paths.log(role)), exited)
        if status == lifecycle.STARTING:
            self._fail_interrupted_startup(run_id, processes)
            return
        events = _PersistingEvents(self, run_id, paths)
        supervisor = RunSupervisor(self._plan(run_id, paths, [], events), events)
        with self._lock:
            self._supervisors[run_id] = supervisor
        logger.info("run %s: re-adopting %s", run_id, sorted(processes))
        supervisor.adopt(processes)
        if status == lifecycle.STOPPING:
            supervisor.stop()

    def _fail_interrupted_startup(self, run_id: str, processes: dict[str, SupervisedProcess]) -> None:
        """The start-up sequence died with the old service: its half-started processes go, the run fails."""
        paths = RunPaths(self.ctx.settings.data_path, run_id)
        events = _PersistingEvents(self, run_id, paths)
        for role in reversed(START_ORDER):
            if role in processes:
                events.process_exited(processes[role], processes[role].terminate(self.ctx.settings.stop_grace_s))
        failure = Failure(
            "startup_error", "the service restarted while this run was starting; its processes were stopped"
        ).to_dict()
        with self.ctx.db.session() as session:
            lifecycle.transition(session, run_id, lifecycle.FAILED, failure=failure)

    def _finish_runs_of_dead_replicas(self) -> None:
        """Runs whose owner stopped heartbeating end with a reason; their processes are not ours to signal."""
        stale_before = utcnow() - timedelta(seconds=self.ctx.settings.replica_stale_after_s)
        with self.ctx.db.session() as session:
            stale = session.scalars(
                select(Run).where(
                    Run.status.in_(lifecycle.ACTIVE - {lifecycle.PENDING}),
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
        """The local backend's default model is built on first use, before the trainer and env load it."""
        settings = self.ctx.settings
        if backend != "local" or settings.local_base_model:
            return None

        def prepare() -> None:
            init_tiny_model(settings.tiny_model_dir)

        return prepare

    def _fail_before_start(self, run_id: str, message: str) -> None:
        failure = Failure("startup_error", self.ctx.scrub(message)).to_dict()
        with self.ctx.db.session() as session:
            lifecycle.transition(session, run_id, lifecycle.FAILED, failure=failure)

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._supervisors.pop(run_id, None)


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
        self.manager.forget(self.run_id)

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
            supervisor = self.manager.supervisor(self.run_id)
            if supervisor is not None:
                supervisor.stop()
