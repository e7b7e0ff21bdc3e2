"""The probe listener (`RLCTL_PROBE_PORT`): `/healthz` and `/readyz` on a port of their own, answered by a process of
their own (`probe_process.py`), so an orchestrator's probes never wait for the event loop or the interpreter lock.

The API's probes are served on its event loop, ahead of the requests queued there (`ProbesFirstProtocol`), but the
loop still parses every request of every connection, and a thread of the service waits for the interpreter lock
behind it: with 200 connections reading and a run training, probes on the API's port had a p99 tens of times their
idle p99 (`benchmarks/runs.py --reads-only --training`, docs/ARCHITECTURE.md#probes).

Answering elsewhere must not hide a loop that no longer runs: every `STATE_INTERVAL_S` a task on the event loop
writes the state file the process answers from: the time of this turn of the loop and the readiness monitor's
newest result (`/readyz`'s status and body, as on the API's port). The process's `/healthz` and `/readyz` are
503 `event loop stalled` once that time is older than `RLCTL_PROBE_STALL_S`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rlctl.service.children import service_child_environment
from rlctl.service.context import Component
from rlctl.service.errors import Unavailable
from rlctl.service.health.readiness import ReadinessMonitor, cancelled
from rlctl.service.settings import REPO_ROOT, Settings
from rlctl.supervisor.process import ProcessSpec, SupervisedProcess
from rlctl.supervisor.run import read_tail

STATE_INTERVAL_S = 0.5
START_TIMEOUT_S = 30.0
STOP_GRACE_S = 5.0


class ProbeListener(Component):
    """Starts the probe process and keeps its state file current until `stop()`."""

    def __init__(self, monitor: ReadinessMonitor, settings: Settings) -> None:
        self._monitor = monitor
        self._settings = settings
        self._scratch = Path(tempfile.mkdtemp(prefix="rlctl-probes-"))  # this service's own: replicas share data
        self._state = self._scratch / "state.json"
        self._process: SupervisedProcess | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.port = 0

    async def start(self) -> None:
        """The state written, the process started (on the event loop's thread: the parent-death signal is that
        thread's) and listening; raises when it cannot listen (a port in use)."""
        self.write_state()
        port_file = self._scratch / "port"
        settings = self._settings
        self._process = SupervisedProcess.spawn(
            ProcessSpec(
                role="probes",
                argv=[
                    sys.executable,
                    "-m",
                    "rlctl.service.health.probe_process",
                    str(self._state),
                    str(port_file),
                    settings.probe_host,
                    str(settings.probe_port),
                    f"{settings.probe_stall_s:g}",
                ],
                env=service_child_environment(),
                cwd=REPO_ROOT,
                log_path=self._scratch / "probes.log",
                die_with_parent=True,
            )
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_file.exists():
            if self._process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(read_tail(self._scratch / "probes.log", 10))
                await self.stop()
                raise RuntimeError(f"the probe listener did not start on port {settings.probe_port}: {tail}")
            await asyncio.sleep(0.02)
        self.port = int(port_file.read_text())
        self._task = asyncio.create_task(self._every_interval(), name="rlctl-probe-state")

    @property
    def pid(self) -> int | None:
        return self._process.identity.pid if self._process is not None else None

    async def stop(self) -> None:
        self._stopping = True
        await cancelled(self._task)
        self._task = None
        if self._process is not None:
            await asyncio.to_thread(self._process.terminate, STOP_GRACE_S)
            self._process = None
        shutil.rmtree(self._scratch, ignore_errors=True)

    def write_state(self) -> None:
        """This turn of the event loop, and `/readyz`'s answer now (replaced at once: a probe reads it whole)."""
        try:
            ready = (200, self._monitor.current().model_dump())
        except Unavailable as exc:
            ready = (exc.status_code, exc.to_body())
        state = {"ticked_at": time.monotonic(), "unavailable": Unavailable.code, "ready": ready}
        written = self._state.with_suffix(".tmp")
        written.write_text(json.dumps(state))
        os.replace(written, self._state)

    async def _every_interval(self) -> None:
        while not self._stopping:
            await asyncio.sleep(STATE_INTERVAL_S)
            self.write_state()
