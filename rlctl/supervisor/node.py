"""The node-side supervisor of a run on Ray: `python -m rlctl.supervisor.node` (docs/RAY.md).

Ray starts it as the entrypoint of the run's job, on the node where the run's resources fit. It:

1. fetches the run's plan from the control plane (`GET /runs/{id}/node/plan`), authenticated with the bootstrap
   secret Ray handed it in its environment; the answer carries the run secret that authenticates every later call
   (the bootstrap secret is then spent, so what Ray keeps in its job records opens nothing);
2. writes the run's files (merged YAML, environment source, a dataset run's split) under the node's data directory;
3. runs the Atropos API, trainer and environment with `RunSupervisor`: the same readiness probes, start and stop
   order, grace period and fate sharing as a local run;
4. mirrors the logs, metrics and trainer state to the control plane (`POST /runs/{id}/node/report`) every
   interval, with the supervisor's events; the control plane answers how much of each file it holds, so a lost
   report or a control-plane restart only means a resend from there.

SIGTERM to the job (Ray's stop_job) or a stop asked in a report's answer stops the three processes in reverse order
(`_detach` says why the supervisor runs outside Ray's process tree for that). The three processes die with the
supervisor (PR_SET_PDEATHSIG; forked from the run's fork server, which dies with the supervisor, they die with it),
and the supervisor stops them when Ray's side of the job dies, so a node whose Ray processes are killed leaves no
orphan.
Nothing here imports the service: the plan is plain data.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.supervisor.forkserver import RUN_PRELOAD, ForkServer
from rlctl.supervisor.process import VISIBLE_DEVICES, ExitStatus, ProcessSpec, SupervisedProcess
from rlctl.supervisor.readiness import atropos_env_registered, http_answers
from rlctl.supervisor.run import LOG_TAIL_LINES, Failure, Outcome, RunPlan, RunSupervisor, read_tail

logger = logging.getLogger("rlctl.node")

# Placeholders the control plane writes into a plan where its own paths stood; each node puts its own back.
DATA_TOKEN = "@RLCTL_DATA@"
PYTHON_TOKEN = "@RLCTL_PYTHON@"
REPO_TOKEN = "@RLCTL_REPO@"

ENV_CONTROL_URL = "RLCTL_NODE_CONTROL_URL"
ENV_RUN_ID = "RLCTL_NODE_RUN_ID"
ENV_SECRET = "RLCTL_NODE_SECRET"  # the bootstrap secret; removed from this process's environment once read
ENV_DATA_DIR = "RLCTL_NODE_DATA_DIR"
SECRET_HEADER = "X-Rlctl-Run-Secret"
MIRRORED_LOGS = ("api", "trainer", "env")
CHUNK_BYTES = 64 * 1024  # per file per report (5 files stay far below the 1 MiB body limit); a backlog takes several
REQUEST_TIMEOUT_S = 10.0
FINISH_DEADLINE_S = 600.0  # how long the final report is retried while the control plane is away
REPO_ROOT = Path(__file__).resolve().parents[2]


class ControlPlaneRefused(Exception):
    """The control plane answered 4xx: the secret is wrong or the run is gone; retrying will not help."""


@dataclass
class Channel:
    """HTTP to the control plane, authenticated by the run's secret."""

    base_url: str
    run_id: str
    secret: str

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.base_url.rstrip('/')}/runs/{self.run_id}/node/{path}",
            data=data,
            method=method,
            headers={SECRET_HEADER: self.secret, "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:  # noqa: S310
                answer = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500:
                raise ControlPlaneRefused(f"{method} {path}: HTTP {exc.code}") from None
            raise
        return answer if isinstance(answer, dict) else {}


@dataclass
class NodeLayout:
    """Where this node keeps the run: the placeholders' values here."""

    data_dir: Path
    python: str = sys.executable
    repo: Path = REPO_ROOT

    def localize(self, value: str) -> str:
        return (
            value.replace(DATA_TOKEN, str(self.data_dir))
            .replace(PYTHON_TOKEN, self.python)
            .replace(REPO_TOKEN, str(self.repo))
        )


def write_files(layout: NodeLayout, files: dict[str, str]) -> None:
    """The run's files, each under the data directory (a path that leaves it is refused)."""
    root = layout.data_dir.resolve()
    for relative, text in files.items():
        target = (root / relative).resolve()
        if root not in target.parents:
            raise ValueError(f"plan file {relative!r} is outside the node's data directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(layout.localize(text))


def assigned_gpus(asked: int, environ: Mapping[str, str]) -> dict[str, str]:
    """What the run's processes get of this node's GPUs: those Ray assigned to the job, as Ray set
    CUDA_VISIBLE_DEVICES for its entrypoint (it does when the job asks for GPUs); none (an empty value) for a run
    that asked for none, which Ray leaves unset, so it would otherwise see every GPU of the node."""
    if asked == 0:
        return {VISIBLE_DEVICES: ""}
    visible = environ.get(VISIBLE_DEVICES)
    return {VISIBLE_DEVICES: visible} if visible is not None else {}


def process_specs(layout: NodeLayout, plan: dict[str, Any]) -> list[ProcessSpec]:
    gpus = assigned_gpus(int(plan.get("gpus") or 0), os.environ)
    specs = []
    for entry in plan["processes"]:
        ready = entry.get("ready") or {}
        probe: Callable[[], bool] | None = None
        if ready.get("kind") == "http":
            probe = http_answers(ready["url"])
        elif ready.get("kind") == "atropos":
            probe = atropos_env_registered(ready["url"], int(ready.get("envs") or 1))
        env = {**_node_environment(), **{k: layout.localize(v) for k, v in entry["env"].items()}, **gpus}
        specs.append(
            ProcessSpec(
                role=entry["role"],
                argv=[layout.localize(arg) for arg in entry["argv"]],
                env=env,
                cwd=Path(layout.localize(entry["cwd"])),
                log_path=Path(layout.localize(entry["log_path"])),
                ready=probe,
                ready_timeout_s=float(entry["ready_timeout_s"]),
                after=tuple(entry["after"]) if entry.get("after") is not None else None,
                probe_after=tuple(entry.get("probe_after") or ()),
                die_with_parent=True,
            )
        )
    return specs


def run_fork_server(plan: dict[str, Any]) -> ForkServer:
    """This run's fork server (docs/RUNS.md#the-fork-server): its three processes are forked from one import of
    torch, transformers and atroposlib. It dies with this supervisor and they die with it, as processes started
    with PR_SET_PDEATHSIG would; it is started by the first spawn, on the supervision thread that lives as long as
    the run. Its own environment holds the run's GPU assignment, as each process's does."""
    env = {**_node_environment(), **assigned_gpus(int(plan.get("gpus") or 0), os.environ)}
    return ForkServer(RUN_PRELOAD, env, die_with_parent=True)


def _node_environment() -> dict[str, str]:
    """This node's environment for the children, less what is the node supervisor's own."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RLCTL_NODE_")}


@dataclass
class Mirror:
    """The run's files on this node and how far the control plane holds each."""

    logs: dict[str, Path]
    metrics: Path
    env_metrics: Path
    trainer_state: Path
    offsets: dict[str, int] = field(default_factory=dict)
    _state_sent: bytes | None = None

    def files(self) -> dict[str, Path]:
        return {
            **{f"log/{role}": path for role, path in self.logs.items()},
            "metrics": self.metrics,
            "env_metrics": self.env_metrics,
        }

    def chunks(self) -> dict[str, dict[str, Any]]:
        out = {}
        for name, path in self.files().items():
            offset = self.offsets.get(name, 0)
            try:
                with path.open("rb") as handle:
                    handle.seek(offset)
                    data = handle.read(CHUNK_BYTES)
            except OSError:
                continue
            if data:
                out[name] = {"offset": offset, "data": base64.b64encode(data).decode()}
        return out

    def state(self) -> dict[str, Any] | None:
        """trainer_state.json when it changed since the last report the control plane took."""
        try:
            raw = self.trainer_state.read_bytes()
        except OSError:
            return None
        if raw == self._state_sent:
            return None
        try:
            state = json.loads(raw)
        except ValueError:
            return None  # being rewritten: next time
        return state if isinstance(state, dict) else None

    def taken(self, answer: dict[str, Any], state_sent: dict[str, Any] | None) -> None:
        offsets = answer.get("offsets")
        if isinstance(offsets, dict):
            self.offsets.update({k: int(v) for k, v in offsets.items() if isinstance(v, int)})
        if state_sent is not None:
            self._state_sent = json.dumps(state_sent).encode()


class Reporter:
    """Sends the events and the mirrored files every interval, in its own thread; keeps what was not taken."""

    def __init__(self, channel: Channel, mirror: Mirror, interval_s: float, on_stop: Callable[[], None]) -> None:
        self.channel = channel
        self.mirror = mirror
        self.interval_s = interval_s
        self.on_stop = on_stop
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._drained = threading.Event()
        self.refused = False
        self._thread = threading.Thread(target=self._loop, name="node-reporter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def event(self, kind: str, **fields: Any) -> None:
        with self._lock:
            self._events.append({"type": kind, **fields})
        self._wake.set()

    def close(self, deadline_s: float) -> bool:
        """Send everything left (the final outcome among it); False when the control plane never took it."""
        self._closing.set()
        self._wake.set()
        self._thread.join(deadline_s)
        return self._drained.is_set()

    def _loop(self) -> None:
        while True:
            closing = self._closing.is_set()
            try:
                pending = self._report_once()
            except ControlPlaneRefused as exc:
                logger.error("the control plane refused this node's report (%s); stopping the run", exc)
                self.refused = True
                self.on_stop()
                return
            except (urllib.error.URLError, OSError, ValueError) as exc:
                logger.warning("report not delivered (%s); retrying", exc)
                pending = True
            if closing and not pending:
                self._drained.set()
                return
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def _report_once(self) -> bool:
        """One report; True while something is left to send."""
        with self._lock:
            events = list(self._events)
        state = self.mirror.state()
        chunks = self.mirror.chunks()
        body = {"events": events, "files": chunks, "trainer_state": state}
        answer = self.channel.call("POST", "report", body)
        with self._lock:
            del self._events[: len(events)]
        self.mirror.taken(answer, state)
        if answer.get("stop"):
            self.on_stop()
        return bool(chunks) and any(len(c["data"]) * 3 // 4 >= CHUNK_BYTES for c in chunks.values())


class ReportingEvents:
    """RunSupervisor's events, reported to the control plane."""

    def __init__(self, reporter: Reporter, trainer_log: Path | None) -> None:
        self.reporter = reporter
        self.trainer_log = trainer_log
        self.outcome: Outcome | None = None
        self.lost = False
        self.done = threading.Event()

    def process_started(self, process: SupervisedProcess) -> None:
        identity = process.identity
        self.reporter.event(
            "process_started", role=process.role, pid=identity.pid, pgid=identity.pgid, start_time=identity.start_time
        )

    def running(self) -> None:
        self.reporter.event("running")

    def process_exited(self, process: SupervisedProcess, status: ExitStatus | None) -> None:
        self.reporter.event(
            "process_exited",
            role=process.role,
            code=status.code if status else None,
            signal=status.signal if status else None,
        )

    def stall_changed(self, stalled: bool, idle_s: float) -> None:
        self.reporter.event("stall", stalled=stalled, idle_s=idle_s)

    def tick(self) -> None:
        pass  # the reporter ships the files on its own clock, start-up included

    def finished(self, outcome: Outcome) -> None:
        if self.lost:  # stopped because Ray lost the job, not because anyone asked
            message = "Ray lost this run's job (its entrypoint died without a stop); its processes were stopped"
            tail = read_tail(self.trainer_log, LOG_TAIL_LINES) if self.trainer_log else []
            outcome = Outcome("failed", Failure("node_lost", message, log_tail=tail))
        self.outcome = outcome
        self.reporter.event(
            "finished", status=outcome.status, failure=outcome.failure.to_dict() if outcome.failure else None
        )
        self.done.set()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def build_plan(run_id: str, plan: dict[str, Any], layout: NodeLayout, events: ReportingEvents) -> RunPlan:
    run_dir = layout.data_dir / "runs" / run_id
    state_path = run_dir / "trainer_state.json"

    def finished_steps(role: str) -> bool | None:
        if role != "trainer" or not state_path.exists():
            return None
        return _read_json(state_path).get("status") == "completed"

    def reported_failure(role: str) -> tuple[str, str] | None:
        state = _read_json(state_path) if role == "trainer" else {}
        kind = state.get("failure_kind")
        if state.get("status") != "failed" or not isinstance(kind, str):
            return None
        return kind, str(state.get("error") or kind)

    prepare_argv = [layout.localize(a) for a in plan.get("prepare") or []]

    def prepare() -> None:
        if prepare_argv:
            subprocess.run(prepare_argv, check=True, stdin=subprocess.DEVNULL, cwd=layout.repo, timeout=600)

    settings = plan["supervision"]
    return RunPlan(
        run_id=run_id,
        specs=process_specs(layout, plan),
        progress=lambda: _read_json(state_path).get("step"),
        finished_steps=finished_steps,
        reported_failure=reported_failure,
        stop_grace_s=float(settings["stop_grace_s"]),
        poll_interval_s=float(settings["poll_interval_s"]),
        stall_after_s=settings.get("stall_after_s"),
        drain_timeout_s=float(settings["drain_timeout_s"]),
        prepare=prepare if prepare_argv else None,
    )


def _detach() -> tuple[int, int] | None:
    """Split into the job's entrypoint (the shim Ray sees) and the supervisor proper (a daemon outside its tree).

    Ray's stop_job signals the entrypoint and every descendant at once, which would stop the API, trainer and
    environment together; and its watcher SIGKILLs the entrypoint's group when Ray's worker dies. So the supervisor
    runs double-forked, outside both: the shim forwards a SIGTERM to it over a pipe, and the end of that pipe (the
    shim gone without a stop) tells the supervisor that Ray lost the job. Returns, in the supervisor, the pipe it
    reads (stop requests, EOF) and the one it writes its exit code to; None in the shim, which never returns.
    """
    to_daemon_r, to_daemon_w = os.pipe()
    to_shim_r, to_shim_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() != 0:
            os._exit(0)  # the intermediate: the supervisor is re-parented away from Ray's process tree
        os.close(to_daemon_w)
        os.close(to_shim_r)
        return to_daemon_r, to_shim_w
    os.close(to_daemon_r)
    os.close(to_shim_w)
    os.waitpid(child, 0)
    signal.signal(signal.SIGTERM, lambda signum, frame: _forward(to_daemon_w))
    signal.signal(signal.SIGINT, lambda signum, frame: _forward(to_daemon_w))
    code = b""
    while True:
        try:
            chunk = os.read(to_shim_r, 16)
        except InterruptedError:
            continue
        if not chunk:
            break
        code += chunk
    os._exit(int(code or b"1"))


def _forward(pipe: int) -> None:
    with contextlib.suppress(OSError):
        os.write(pipe, b"s")


def _watch_shim(pipe: int, stop: Callable[[], None], lost: Callable[[], None], done: threading.Event) -> None:
    """A byte: a stop (SIGTERM to the job, e.g. Ray's stop_job). End of file: the shim died without one. After a
    stop, the shim's death is no loss and the run ends `stopped`, as asked (Ray SIGKILLs the shim when the stop
    outlasts the job's RAY_JOB_STOP_WAIT_TIME_S)."""
    stop_asked = False
    while not done.is_set():
        try:
            data = os.read(pipe, 1)
        except InterruptedError:
            continue
        if data:
            stop_asked = True
            stop()
            continue
        if stop_asked:
            logger.info("the job's entrypoint is gone after a stop; the stop goes on")
        elif not done.is_set():
            logger.warning("the job's entrypoint is gone without a stop: Ray lost this run's job; stopping the run")
            lost()
        return


def main() -> int:
    pipes = _detach()
    assert pipes is not None
    from_shim, to_shim = pipes
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    code = 1
    try:
        code = _supervise(from_shim)
    finally:
        with contextlib.suppress(OSError):
            os.write(to_shim, str(code).encode())
    return code


def _supervise(from_shim: int) -> int:
    control_url, run_id = os.environ[ENV_CONTROL_URL], os.environ[ENV_RUN_ID]
    bootstrap = os.environ.pop(ENV_SECRET)
    data_dir = Path(os.environ.get(ENV_DATA_DIR) or Path.home() / ".rlctl-node").expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    os.chdir(data_dir)  # not Ray's job directory, which Ray may remove; and where an operator looks for it
    layout = NodeLayout(data_dir)
    plan = Channel(control_url, run_id, bootstrap).call("GET", "plan")
    channel = Channel(control_url, run_id, str(plan["secret"]))
    logger.info("run %s on %s: plan received; data under %s", run_id, socket.gethostname(), data_dir)
    write_files(layout, plan["files"])
    logs = {role: Path(layout.localize(path)) for role, path in plan["logs"].items()}
    run_dir = data_dir / "runs" / run_id
    mirror = Mirror(logs, run_dir / "metrics.jsonl", run_dir / "env_metrics.jsonl", run_dir / "trainer_state.json")
    supervisor_ref: list[RunSupervisor] = []

    def request_stop() -> None:
        for supervisor in supervisor_ref:
            supervisor.stop()

    reporter = Reporter(channel, mirror, float(plan["supervision"]["report_interval_s"]), request_stop)
    events = ReportingEvents(reporter, logs.get("trainer"))

    def lost() -> None:
        events.lost = True
        request_stop()

    fork_server = run_fork_server(plan) if plan["supervision"].get("fork_server") else None
    supervisor = RunSupervisor(build_plan(run_id, plan, layout, events), events, fork_server)
    supervisor_ref.append(supervisor)
    reporter.start()
    supervisor.start()
    threading.Thread(target=_watch_shim, args=(from_shim, request_stop, lost, events.done), daemon=True).start()
    events.done.wait()
    supervisor.join(60)
    if fork_server is not None:
        fork_server.close()  # it exits once the processes it forked have
    delivered = reporter.close(FINISH_DEADLINE_S)
    outcome = events.outcome
    logger.info(
        "run %s ended %s; outcome %s",
        run_id,
        outcome.status if outcome else "?",
        "reported" if delivered else "NOT reported",
    )
    return 0 if delivered else 1


if __name__ == "__main__":
    sys.exit(main())
