"""A real two-node Ray cluster on loopback, started with the `ray` package's own commands (docs/RAY.md#testing).

The head and a second node each get one logical CPU, a little memory and a small object store, so a run asking
for one CPU fits on each node once and two runs spread over the two. Each node has its own data directory for
its runs (RLCTL_NODE_DATA_DIR): nothing is shared with the control plane's. `stop` is `ray stop --force`, then a
sweep of whatever still runs from the cluster's directory, so a failed test leaves nothing behind.
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RayCluster:
    root: Path
    gcs_port: int
    dashboard_port: int
    worker_manager_port: int
    env: dict[str, str]
    nodes: int = 2

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
        result = subprocess.run(
            [RAY, *args], env=env, capture_output=True, text=True, timeout=scaled(timeout), stdin=subprocess.DEVNULL
        )
        if result.returncode != 0:
            raise RuntimeError(f"ray {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")

    def start(self) -> None:
        common = [
            "--node-ip-address=127.0.0.1",
            "--num-cpus=1",
            "--num-gpus=0",
            f"--memory={NODE_MEMORY_BYTES}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats",
        ]
        self._ray(
            "start",
            "--head",
            f"--port={self.gcs_port}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
            "--include-dashboard=true",
            f"--temp-dir={self.root / 'ray'}",
            *common,
            data="head",
        )
        if self.nodes > 1:
            self._ray(
                "start",
                f"--address={self.gcs_address}",
                f"--node-manager-port={self.worker_manager_port}",
                *common,
                data="worker",
            )
        wait_until(
            lambda: len(self.alive_nodes()) == self.nodes, timeout=scaled(120), interval=1, message="Ray nodes up"
        )

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
        """`ray stop --force`, then anything still running from the cluster's directories (its temp dir, the nodes'
        run directories): nothing of the cluster outlives the session, even after a failure."""
        with contextlib.suppress(Exception):
            subprocess.run(
                [RAY, "stop", "--force"],
                env=self.env,
                capture_output=True,
                timeout=scaled(60),
                stdin=subprocess.DEVNULL,
            )
        for pid in leftover_processes(self.root):
            with contextlib.suppress(psutil.Error):
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def leftover_processes(root: Path) -> list[int]:
    """Processes whose command line, working directory or environment names the cluster's directory."""
    marker = str(root)
    found = []
    for process in psutil.process_iter(["cmdline", "cwd"]):
        with contextlib.suppress(psutil.Error):
            if process.pid == os.getpid():
                continue
            if marker in " ".join(process.info["cmdline"] or []) or marker in (process.info["cwd"] or ""):
                found.append(process.pid)
    return found


def start_cluster(nodes: int = 2) -> RayCluster:
    root = Path(tempfile.mkdtemp(prefix="rlray-", dir="/tmp"))  # short: Ray's socket paths live under it
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RLCTL_"))}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"  # `python` on the nodes: this environment's
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # The dashboard starts its modules as processes and gives each 30 s; a loaded 2-core machine needs longer.
    env["RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT"] = str(scaled(240))
    cluster = RayCluster(root, _free_port(), _free_port(), _free_port(), env, nodes)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
        raise
    (root / "cluster.json").write_text(json.dumps({"dashboard": cluster.dashboard_url}))
    return cluster
