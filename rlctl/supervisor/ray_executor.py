"""The `ray` executor: each run is one Ray job (docs/RAY.md).

The job is submitted with Ray's Job Submission API (`JobSubmissionClient`) against the cluster's dashboard address
(RLCTL_RAY_ADDRESS). Its entrypoint is the node-side supervisor (`python -m rlctl.supervisor.node`), which runs the
three processes on the node Ray placed the job on, with the rules of rlctl/supervisor/run.py, and reports over HTTP; the
control plane's routes hand its events to `deliver`. The run's resources become the entrypoint's `num_cpus`,
`num_gpus` and `memory`, so Ray places the job where they fit. The submission id is the run's handle.

This side watches each run in a thread: it ticks the caller's events (metrics ingestion from the mirrored files),
and asks Ray for the job's status. A job Ray reports ended (FAILED, STOPPED, SUCCEEDED) before its node reported an
outcome, or whose node Ray reports dead, fails the run with the kind `node_lost` and the last lines of its log.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rlctl.supervisor.executor import Executor, ProcessRecord, Resources, Usage
from rlctl.supervisor.node import ENV_CONTROL_URL, ENV_RUN_ID, ENV_SECRET
from rlctl.supervisor.process import ExitStatus, Liveness, ProcessIdentity, SupervisedProcess
from rlctl.supervisor.run import LOG_TAIL_LINES, TRAINER, Failure, Outcome, RunEvents, RunPlan, read_tail

logger = logging.getLogger("rlctl.supervisor.ray")

GB = 1_000_000_000
JOB_POLL_S = 2.0  # how often Ray is asked for a job's status (its dashboard answers over HTTP)
CLUSTER_CACHE_S = 5.0  # the cluster's nodes change rarely; admission asks often
TERMINAL_JOB_STATES = {"SUCCEEDED", "FAILED", "STOPPED"}
ENTRYPOINT = "python -m rlctl.supervisor.node"


class SecretIssuer(Protocol):
    def __call__(self, run_id: str) -> str:
        """A new bootstrap secret for the run's job (the caller stores its hash)."""
        ...


@dataclass(frozen=True)
class Node:
    node_id: str
    alive: bool
    cpus: float
    gpus: float
    memory_gb: float


@dataclass
class _Watched:
    run_id: str
    submission_id: str
    events: RunEvents
    plan: RunPlan
    processes: dict[str, SupervisedProcess] = field(default_factory=dict)
    stop_requested: bool = False
    stop_sent: bool = False
    finished: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    detach: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


class RayExecutor(Executor):
    name = "ray"

    def __init__(
        self,
        address: str,
        control_url: str,
        issue_secret: SecretIssuer,
        log_path: Callable[[str, str], Path],
        node_python: str = "python",
        client: Any = None,
    ) -> None:
        if client is None:
            from ray.job_submission import JobSubmissionClient  # imported on use: the local executor never needs it

            client = JobSubmissionClient(address)
        self.address = address
        self.client = client
        self.control_url = control_url
        self.issue_secret = issue_secret
        self.log_path = log_path
        self.entrypoint = ENTRYPOINT.replace("python", node_python, 1)
        self._runs: dict[str, _Watched] = {}
        self._lock = threading.Lock()
        self._nodes: tuple[float, list[Node]] = (0.0, [])

    # --- start, adopt, stop ---

    def start(self, plan: RunPlan, events: RunEvents, resources: Resources) -> str | None:
        run_id = plan.run_id
        bootstrap = self.issue_secret(run_id)
        submission_id = f"rlctl-{run_id}-{secrets.token_hex(3)}"
        # Ray signals the job's entrypoint at a stop and SIGKILLs it after this long: the node-side supervisor needs
        # the grace period of each of its three processes (rlctl/supervisor/node.py stops them in order).
        stop_wait_s = int(3 * plan.stop_grace_s + 30)
        self.client.submit_job(
            entrypoint=self.entrypoint,
            submission_id=submission_id,
            runtime_env={
                "env_vars": {
                    ENV_CONTROL_URL: self.control_url,
                    ENV_RUN_ID: run_id,
                    ENV_SECRET: bootstrap,
                    "RAY_JOB_STOP_WAIT_TIME_S": str(stop_wait_s),
                }
            },
            metadata={"rlctl_run_id": run_id},
            entrypoint_num_cpus=resources.cpus,
            entrypoint_num_gpus=resources.gpus,
            entrypoint_memory=int(resources.memory_gb * GB),
        )
        logger.info("run %s: submitted to Ray as job %s", run_id, submission_id)
        self._watch(_Watched(run_id, submission_id, events, plan))
        return submission_id

    def adopt(
        self,
        plan: RunPlan,
        events: RunEvents,
        handle: str | None,
        processes: Sequence[ProcessRecord],
        starting: bool,
    ) -> bool:
        """Re-attach by submission id: the node-side supervisor went on while the control plane was away (its
        reports waited), so a run that was starting keeps starting."""
        if handle is None:
            events.finished(Outcome("failed", Failure("node_lost", "the run has no Ray submission id to re-attach")))
            return True
        watched = _Watched(plan.run_id, handle, events, plan)
        for record in processes:
            if record.pid is not None:
                identity = ProcessIdentity(record.pid, record.pgid or record.pid, record.start_time or 0.0)
                watched.processes[record.role] = SupervisedProcess.adopt(
                    record.role, identity, record.log_path, record.exited
                )
        logger.info("run %s: re-attaching Ray job %s", plan.run_id, handle)
        self._watch(watched)
        return True

    def stop(self, run_id: str) -> None:
        with self._lock:
            watched = self._runs.get(run_id)
        if watched is None:
            return
        with watched.lock:
            if watched.stop_requested:
                return
            watched.stop_requested = True
        threading.Thread(target=self._stop_job, args=(watched,), name=f"ray-stop-{run_id}", daemon=True).start()

    def _stop_job(self, watched: _Watched) -> None:
        """Through Ray: its stop_job signals the job's entrypoint (the node-side supervisor then stops the three
        processes in order). The node's next report also says stop.

        A job Ray has not placed yet (PENDING: waiting for resources) is cancelled here: Ray only delivers the stop
        once it places the job, which may be long after; but nothing of the run can start any more (the control
        plane hands no plan to a run being stopped, rlctl/service/runs/node.py), so the run is stopped now. Ray then
        ends the job as soon as it places it."""
        try:
            pending = self._job_status(watched.submission_id) == "PENDING"
            self.client.stop_job(watched.submission_id)
            watched.stop_sent = True
        except Exception:  # noqa: BLE001 - the report's answer still asks the node to stop
            logger.exception("run %s: Ray's stop_job failed", watched.run_id)
            return
        if pending:
            with watched.lock:
                if not watched.finished and not watched.processes:
                    logger.info("run %s: stopped before Ray placed job %s", watched.run_id, watched.submission_id)
                    self._finish(watched, Outcome("stopped"))

    def _job_status(self, submission_id: str) -> str:
        info = self.client.get_job_info(submission_id)
        return str(getattr(info.status, "value", info.status))

    def watching(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self._runs

    def detach_all(self, timeout_s: float) -> None:
        with self._lock:
            runs = list(self._runs.values())
        for watched in runs:
            watched.detach.set()
        deadline = time.monotonic() + timeout_s
        for watched in runs:
            if watched.thread is not None:
                watched.thread.join(max(0.0, deadline - time.monotonic()))

    # --- reads ---

    def status(self, run_id: str, process: ProcessRecord) -> Liveness:
        """The node's processes are not this host's: alive while the node reports them running."""
        if process.exited is not None:
            return Liveness.DEAD
        return Liveness.ALIVE if self.watching(run_id) else Liveness.UNKNOWN

    def logs(self, run_id: str, role: str, log_path: Path, lines: int) -> list[str]:
        return read_tail(log_path, lines)  # the mirror the node keeps up to date

    # --- the node's reports (through the control plane's route) ---

    def deliver(self, run_id: str, events: list[dict[str, Any]], log_paths: dict[str, Path]) -> bool:
        """Apply the node's events in order; False when this run is not watched here (the node sends them again)."""
        with self._lock:
            watched = self._runs.get(run_id)
        if watched is None:
            return False
        with watched.lock:
            for event in events:
                self._apply(watched, event, log_paths)
        return True

    def _apply(self, watched: _Watched, event: dict[str, Any], log_paths: dict[str, Path]) -> None:
        kind, role = event.get("type"), str(event.get("role") or "")
        if watched.finished:
            return
        if kind == "process_started":
            identity = ProcessIdentity(int(event["pid"]), int(event["pgid"]), float(event["start_time"]))
            process = SupervisedProcess.adopt(role, identity, log_paths[role])
            watched.processes[role] = process
            watched.events.process_started(process)
        elif kind == "running":
            watched.events.running()
        elif kind == "process_exited" and role in watched.processes:
            status = ExitStatus(event.get("code"), event.get("signal"))
            watched.events.process_exited(watched.processes[role], status)
        elif kind == "stall":
            watched.events.stall_changed(bool(event.get("stalled")), float(event.get("idle_s") or 0.0))
        elif kind == "finished":
            failure = event.get("failure")
            outcome = Outcome(event["status"], Failure(**failure) if isinstance(failure, dict) else None)
            self._finish(watched, outcome)

    def _finish(self, watched: _Watched, outcome: Outcome) -> None:
        """Once per run (the caller holds its lock)."""
        watched.finished = True
        with self._lock:
            self._runs.pop(watched.run_id, None)
        watched.events.finished(outcome)

    # --- watching ---

    def _watch(self, watched: _Watched) -> None:
        with self._lock:
            self._runs[watched.run_id] = watched
        watched.thread = threading.Thread(
            target=self._loop, args=(watched,), name=f"ray-run-{watched.run_id}", daemon=True
        )
        watched.thread.start()

    def _loop(self, watched: _Watched) -> None:
        asked_at = 0.0
        while not watched.detach.wait(watched.plan.poll_interval_s):
            if watched.finished:
                return
            watched.events.tick()  # metrics from the mirrored files; a STOPPING run calls stop()
            if time.monotonic() - asked_at < JOB_POLL_S:
                continue
            asked_at = time.monotonic()
            try:
                lost = self._lost(watched)
            except Exception as exc:  # noqa: BLE001 - Ray's dashboard unreachable: ask again next time
                logger.warning("run %s: cannot read job %s from Ray: %s", watched.run_id, watched.submission_id, exc)
                continue
            if lost is None:
                continue
            with watched.lock:
                if not watched.finished:
                    self._finish(watched, lost)
            return

    def _lost(self, watched: _Watched) -> Outcome | None:
        """The outcome of a job that ended (or lost its node) without its node reporting one; None while it runs."""
        info = self.client.get_job_info(watched.submission_id)
        status = str(getattr(info.status, "value", info.status))
        if status not in TERMINAL_JOB_STATES:
            node_id = getattr(info, "driver_node_id", None)
            if status != "RUNNING" or not node_id or not self._node_dead(node_id):
                return None
            message = f"Ray reports the node of job {watched.submission_id} ({node_id}) dead"
        else:
            if watched.finished:
                return None
            if watched.stop_requested and (status == "STOPPED" or not watched.processes):
                # Stopped before its node reported an outcome: never placed, or refused its plan (stopping).
                return Outcome("stopped")
            message = f"Ray reports job {watched.submission_id} {status} without an outcome from its node"
            if info.message:
                message += f": {info.message}"
        return Outcome("failed", Failure("node_lost", message, log_tail=self._tail(watched)))

    def _tail(self, watched: _Watched) -> list[str]:
        """The trainer's mirrored log; when it has nothing, what Ray kept of the job's own output."""
        tail = read_tail(self.log_path(watched.run_id, TRAINER), LOG_TAIL_LINES)
        if tail:
            return [watched.plan.scrub(line) for line in tail]
        try:
            text = self.client.get_job_logs(watched.submission_id)
        except Exception:  # noqa: BLE001 - nothing more to show
            return []
        return [watched.plan.scrub(line) for line in str(text).splitlines()[-LOG_TAIL_LINES:]]

    # --- the cluster (admission) ---

    def nodes(self) -> list[Node]:
        checked_at, nodes = self._nodes
        if time.monotonic() - checked_at < CLUSTER_CACHE_S and nodes:
            return nodes
        from ray.util.state import list_nodes

        nodes = [
            Node(
                node_id=state.node_id,
                alive=state.state == "ALIVE",
                cpus=float(state.resources_total.get("CPU", 0)),
                gpus=float(state.resources_total.get("GPU", 0)),
                memory_gb=float(state.resources_total.get("memory", 0)) / GB,
            )
            for state in list_nodes(address=self.address, detail=True, raise_on_missing_output=False)
        ]
        self._nodes = (time.monotonic(), nodes)
        return nodes

    def _node_dead(self, node_id: str) -> bool:
        """Ray lists the node as dead (it keeps dead nodes listed). A node missing from the answer is not taken
        for dead: a loaded cluster's state API may answer with part of its nodes."""
        self._nodes = (0.0, self._nodes[1])  # asked about a job's node: read it fresh
        return any(node.node_id == node_id and not node.alive for node in self.nodes())

    def _alive(self) -> list[Node]:
        try:
            return [node for node in self.nodes() if node.alive]
        except Exception as exc:  # noqa: BLE001 - no answer from Ray: nothing fits now
            logger.warning("cannot read the Ray cluster's nodes: %s", exc)
            return []

    def has_gpus(self) -> bool:
        return any(node.gpus > 0 for node in self._alive())

    def refusal(self, resources: Resources) -> str | None:
        """More than any one node has: a job runs on one node, so it could never be placed."""
        alive = self._alive()
        if not alive:
            return None  # cannot tell now; admission waits for the cluster
        if not any(_holds(node, resources) for node in alive):
            largest = max(alive, key=lambda node: (node.gpus, node.cpus, node.memory_gb))
            return (
                f"{resources.cpus:g} CPUs, {resources.gpus} GPU(s), {resources.memory_gb:g} GB asked for; the largest "
                f"node of the Ray cluster has {largest.cpus:g} CPUs, {largest.gpus:g} GPU(s), "
                f"{largest.memory_gb:.1f} GB"
            )
        return None

    def fits(self, resources: Resources, usage: Usage) -> bool:
        """Within what the cluster's live nodes have, beside what the admitted runs hold. Ray then places the job on
        a node where it fits (a run that fits the total but no single node waits `starting` until one frees)."""
        alive = self._alive()
        if not alive:
            return False
        total_cpus = sum(node.cpus for node in alive)
        total_gpus = sum(node.gpus for node in alive)
        total_memory = sum(node.memory_gb for node in alive)
        return (
            usage.resources.cpus + resources.cpus <= total_cpus + 1e-9
            and usage.resources.gpus + resources.gpus <= total_gpus + 1e-9
            and usage.resources.memory_gb + resources.memory_gb <= total_memory + 1e-9
        )


def _holds(node: Node, resources: Resources) -> bool:
    return node.cpus >= resources.cpus and node.gpus >= resources.gpus and node.memory_gb >= resources.memory_gb
