"""A real two-node Ray cluster on loopback, started with the `ray` package's own commands (docs/RAY.md#testing).

The head and a second node each get one logical CPU, a little memory and a small object store, so a run asking
for one CPU fits on each node once and two runs spread over the two; the second node can be given logical GPUs
(`ray start --num-gpus`, no GPU needed: Ray then assigns them and sets CUDA_VISIBLE_DEVICES for a job that asks).
Each node has its own data directory for its runs (RLCTL_NODE_DATA_DIR): nothing is shared with the control
plane's.

Other people may run Ray clusters on the same machine at the same time, so this one names every port it listens
on (each a free loopback port, none of Ray's defaults), and `stop` never runs `ray stop`, which would stop every
Ray cluster of the machine: it ends only this cluster's processes (those that name its directory in their command
line, working directory or environment, and their descendants), SIGTERM then SIGKILL after a grace period, so a
failed test leaves nothing behind and touches nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.support.waiting import scaled, wait_until

VENV_BIN = Path(sys.executable).parent
RAY = str(VENV_BIN / "ray")
NODE_MEMORY_BYTES = 3 * 1_000_000_000
OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray's smallest allowed store is 75 MiB
WORKER_PORTS = 24  # per node: Ray's workers (a job's supervisor actor, idle workers) each listen on one
STOP_GRACE_S = 10
START_ATTEMPTS = 3  # `ray start` waits a fixed 30 s for its processes, which a loaded 2-core machine can miss


def _free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports (held together while chosen, so none is handed out twice)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _free_port() -> int:
    return _free_ports(1)[0]


def node_ports() -> list[str]:
    """`ray start` flags naming every port a node listens on besides the head's GCS and dashboard ports."""
    names = [
        "node-manager-port",
        "object-manager-port",
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "runtime-env-agent-port",
        "metrics-export-port",
    ]
    ports = _free_ports(len(names) + WORKER_PORTS)
    flags = [f"--{name}={port}" for name, port in zip(names, ports, strict=False)]
    flags.append("--worker-port-list=" + ",".join(str(port) for port in ports[len(names) :]))
    return flags


@dataclass
class RayCluster:
    root: Path
    gcs_port: int
    dashboard_port: int
    env: dict[str, str]
    nodes: int = 2
    worker_gpus: int = 0
    worker_manager_port: int = 0  # set by start()

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    def node_data_dir(self, name: str) -> Path:
        return self.root / f"node-{name}"

    def _ray(self, *args: str, data: str, timeout: float = 180) -> None:
        env = {**self.env, "RLCTL_NODE_DATA_DIR": str(self.node_data_dir(data))}
        try:
            result = subprocess.run(
                [RAY, *args], env=env, capture_output=True, text=True, timeout=scaled(timeout), stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"ray {' '.join(args)} took over {scaled(timeout):g} s") from None
        if result.returncode != 0:
            output = f"{result.stdout}\n{result.stderr}"
            reasons = [line for line in output.splitlines() if any(word in line for word in ("Error", "Exception"))]
            raise RuntimeError(f"ray {' '.join(args)} failed: {reasons[-5:]}\n{output[-3000:]}")

    def start(self) -> None:
        common = [
            "--node-ip-address=127.0.0.1",
            "--num-cpus=1",
            f"--memory={NODE_MEMORY_BYTES}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats",
        ]
        for attempt in range(1, START_ATTEMPTS + 1):  # the head has fixed start-up time-outs too
            try:
                self._ray(
                    "start",
                    "--head",
                    f"--port={self.gcs_port}",
                    "--dashboard-host=127.0.0.1",
                    f"--dashboard-port={self.dashboard_port}",
                    "--include-dashboard=true",
                    f"--ray-client-server-port={_free_port()}",
                    f"--temp-dir={self.root / 'ray'}",
                    "--num-gpus=0",
                    *common,
                    *node_ports(),
                    data="head",
                )
                break
            except RuntimeError:
                if attempt == START_ATTEMPTS:
                    raise
                _end(leftover_processes(self.root, by_environment=True))
                self.gcs_port, self.dashboard_port = _free_ports(2)
        if self.nodes > 1:
            self._start_worker(common)
        wait_until(
            lambda: len(self.alive_nodes()) == self.nodes, timeout=scaled(120), interval=1, message="Ray nodes up"
        )

    def _start_worker(self, common: list[str], attempts: int = START_ATTEMPTS) -> None:
        """The second node. `ray start` gives a joining raylet a fixed 30 s to register, which a loaded 2-core
        machine can miss: then that attempt's processes are ended and it starts again, on fresh ports."""
        for attempt in range(1, attempts + 1):
            ports = node_ports()
            self.worker_manager_port = int(ports[0].split("=")[1])
            try:
                self._ray(
                    "start",
                    f"--address={self.gcs_address}",
                    f"--num-gpus={self.worker_gpus}",
                    *common,
                    *ports,
                    data="worker",
                )
                return
            except RuntimeError:
                if attempt == attempts:
                    raise
                _end(leftover_processes(self.node_data_dir("worker"), by_environment=True))

    def alive_nodes(self) -> list[dict[str, object]]:
        from ray.util.state import list_nodes

        try:
            nodes = list_nodes(address=self.dashboard_url, detail=True, raise_on_missing_output=False)
        except Exception:  # noqa: BLE001 - the dashboard is still starting
            return []
        return [{"id": n.node_id, "head": n.is_head_node} for n in nodes if n.state == "ALIVE"]

    def node_id(self, head: bool) -> str:
        return next(str(n["id"]) for n in self.alive_nodes() if n["head"] is head)

    def worker_raylet(self) -> psutil.Process:
        marker = f"--node_manager_port={self.worker_manager_port}"
        for process in psutil.process_iter(["name", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                if "raylet" in (process.info["name"] or "") and marker in (process.info["cmdline"] or []):
                    return process
        raise LookupError("the second node's raylet is not running")

    def kill_worker_node(self) -> list[int]:
        """SIGKILL the second node's raylet and every process under it (its workers, its jobs' entrypoints): the
        node dies as a machine would, without telling anyone. Returns the pids killed."""
        raylet = self.worker_raylet()
        victims = [raylet, *raylet.children(recursive=True)]
        for process in victims:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(victims, timeout=scaled(10))
        return [p.pid for p in victims]

    def stop(self) -> None:
        """This cluster's processes only (never `ray stop`, which stops every Ray cluster of the machine): SIGTERM,
        SIGKILL to what is left after the grace period, until nothing of the cluster runs, even after a failure."""
        _end(leftover_processes(self.root, by_environment=True))
        _end(leftover_processes(self.root, by_environment=True))  # anything started meanwhile
        if not leftover_processes(self.root, by_environment=True):
            shutil.rmtree(self.root, ignore_errors=True)


def _end(pids: list[int]) -> None:
    """SIGTERM, then SIGKILL to what is left after the grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        victims = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                process.send_signal(sig)
                victims.append(process)
        if not victims:
            return
        _gone, alive = psutil.wait_procs(victims, timeout=scaled(STOP_GRACE_S))
        pids = [process.pid for process in alive]


def leftover_processes(root: Path, by_environment: bool = False) -> list[int]:
    """Processes whose command line or working directory names `root` (with `by_environment`, also those whose
    environment does: every process a node's `ray start` began), and their descendants (Ray's workers rename
    themselves, `ray::IDLE`)."""
    marker = str(root)
    found: set[int] = set()
    for process in psutil.process_iter(["cmdline", "cwd"]):
        with contextlib.suppress(psutil.Error):
            if process.pid == os.getpid():
                continue
            named = marker in " ".join(process.info["cmdline"] or []) or marker in (process.info["cwd"] or "")
            if not named and by_environment:
                named = any(marker in value for value in process.environ().values())
            if named:
                found.add(process.pid)
                found.update(child.pid for child in process.children(recursive=True))
    found.discard(os.getpid())
    return sorted(found)


def start_cluster(nodes: int = 2, worker_gpus: int = 0) -> RayCluster:
    root = Path(tempfile.mkdtemp(prefix="rlray-", dir="/tmp"))  # short: Ray's socket paths live under it
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RLCTL_"))}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"  # `python` on the nodes: this environment's
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # The dashboard starts its modules as processes and gives each 30 s; a loaded 2-core machine needs longer.
    env["RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT"] = str(scaled(240))
    gcs_port, dashboard_port = _free_ports(2)
    cluster = RayCluster(root, gcs_port, dashboard_port, env, nodes, worker_gpus)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
        raise
    (root / "cluster.json").write_text(json.dumps({"dashboard": cluster.dashboard_url}))
    return cluster
