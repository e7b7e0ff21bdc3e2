"""Child processes of the service's own work (environment schema reads, the local backend's tiny model), and the
fork server that they and the runs' processes are forked from (docs/RUNS.md#the-fork-server).

They run in sessions of their own with a time-out, like `subprocess.run`; the service's shutdown ends those still
running (SIGKILL to their session), so a stopped service leaves none of them behind.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from service.settings import SECRET_ENV_NAMES
from supervisor.forkserver import EXIT_RECORD_WAIT_S, ForkServer, LaunchRequest, read_exit, runnable
from supervisor.process import START_TIME_TOLERANCE_S, status_from_wait

# What the fork server imports once for every process forked from it: the trainer's and the environments' heavy
# imports, and the Atropos API.
FORK_PRELOAD = ("torch", "transformers", "peft", "atroposlib.envs.base", "atroposlib.api")

_fork_server: ForkServer | None = None
_fork_server_lock = threading.Lock()


def process_fork_server() -> ForkServer:
    """One per service process (the apps a test session builds in one process share it); started on first use."""
    global _fork_server
    with _fork_server_lock:
        if _fork_server is None:
            _fork_server = ForkServer(FORK_PRELOAD, service_child_environment())
        return _fork_server


def service_child_environment() -> dict[str, str]:
    """The service's environment less every secret, every RLCTL_* variable and WANDB_MODE (a run's to decide)."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in SECRET_ENV_NAMES and not k.startswith("RLCTL_") and k != "WANDB_MODE"
    }


class ChildRunner:
    def __init__(self, fork_server: ForkServer | None = None) -> None:
        self.fork_server = fork_server  # children are forked from it where it can run them
        self._lock = threading.Lock()
        self._running: set[int] = set()  # their sessions (a child's pid is its session's id)
        self._closed = False

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout_s: float
    ) -> subprocess.CompletedProcess[bytes]:
        """Run to its end and return its exit code and output; TimeoutExpired (the child killed) past
        `timeout_s`; ChildProcessError once the service is closing."""
        if self.fork_server is not None and runnable(argv, sys.executable):
            completed = self._run_forked(self.fork_server, argv, env, cwd, timeout_s)
            if completed is not None:
                return completed
        with self._lock:
            self._refuse_when_closed()
            process = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            self._running.add(process.pid)
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(process.pid)
            process.communicate()
            raise
        finally:
            with self._lock:
                self._running.discard(process.pid)
        return subprocess.CompletedProcess(list(argv), process.returncode, stdout, stderr)

    def _run_forked(
        self, server: ForkServer, argv: Sequence[str], env: Mapping[str, str], cwd: Path, timeout_s: float
    ) -> subprocess.CompletedProcess[bytes] | None:
        """As `run`, forked from the fork server; None when it could not fork (then the caller starts it)."""
        with tempfile.TemporaryDirectory(prefix="rlctl-child-") as scratch:
            record = Path(scratch) / "exit"
            (out_read, out_write), (err_read, err_write) = os.pipe(), os.pipe()
            try:
                self._refuse_when_closed()
                # Not under our lock: the server may be starting (seconds), and close() must not wait for that.
                request = LaunchRequest(argv, env, str(cwd), None, str(record))
                forked = server.launch(request, (out_write, err_write), give_up=lambda: self._closed)
            finally:
                os.close(out_write)
                os.close(err_write)
            with self._lock:
                closing = self._closed
                if forked is not None and not closing:
                    self._running.add(forked[0])
            if forked is None or closing:
                if forked is not None:
                    _kill(forked[0])  # forked while the service closed: it does not outlive the service
                os.close(out_read)
                os.close(err_read)
                self._refuse_when_closed()  # not started anew either
                return None
            pid, start_time = forked
            try:
                stdout, stderr, finished = _read_until_closed(out_read, err_read, time.monotonic() + timeout_s)
                if not finished:
                    _kill(pid)
                    raise subprocess.TimeoutExpired(list(argv), timeout_s, stdout, stderr)
                returncode = _recorded_returncode(record, pid, start_time)
            finally:
                with self._lock:
                    self._running.discard(pid)
        return subprocess.CompletedProcess(list(argv), returncode, stdout, stderr)

    def _refuse_when_closed(self) -> None:
        if self._closed:
            raise ChildProcessError("the service is stopping")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """End every child still running; later calls to run() are refused."""
        with self._lock:
            self._closed = True
            running = list(self._running)
        for session in running:
            _kill(session)


def _read_until_closed(out_fd: int, err_fd: int, deadline: float) -> tuple[bytes, bytes, bool]:
    """Both outputs until the child closes them (it ended), or the deadline: (stdout, stderr, closed in time).
    The descriptors are closed either way."""
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    selector = selectors.DefaultSelector()
    for fd in chunks:
        selector.register(fd, selectors.EVENT_READ)
    try:
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for key, _ in selector.select(timeout=remaining):
                data = os.read(key.fd, 65536)
                if data:
                    chunks[key.fd].append(data)
                else:
                    selector.unregister(key.fd)
        closed = not selector.get_map()
    finally:
        selector.close()
        os.close(out_fd)
        os.close(err_fd)
    return b"".join(chunks[out_fd]), b"".join(chunks[err_fd]), closed


def _recorded_returncode(record: Path, pid: int, start_time: float) -> int:
    """As Popen.returncode (-N for a signal); -1 when no exit was recorded in time (the server itself is gone)."""
    wait_status = read_exit(record, pid, start_time, START_TIME_TOLERANCE_S, EXIT_RECORD_WAIT_S)
    if wait_status is None:
        return -1
    status = status_from_wait(wait_status)
    return -status.signal if status.signal is not None else status.code or 0


def _kill(session: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(session, signal.SIGKILL)
