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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rlctl.service.settings import SECRET_ENV_NAMES
from rlctl.supervisor.forkserver import EXIT_RECORD_WAIT_S, RUN_PRELOAD, ForkServer, LaunchRequest, read_exit, runnable
from rlctl.supervisor.process import START_TIME_TOLERANCE_S, status_from_wait

_fork_server: ForkServer | None = None
_fork_server_lock = threading.Lock()


def process_fork_server() -> ForkServer:
    """One per service process (the apps a test session builds in one process share it); started on first use."""
    global _fork_server
    with _fork_server_lock:
        if _fork_server is None:
            _fork_server = ForkServer(RUN_PRELOAD, service_child_environment())
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
        if not self._track(process.pid):
            process.communicate()  # killed by _track: reaped here
            self._refuse_when_closed()
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
            if forked is None or not self._track(forked[0]):
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

    def open(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path) -> PipedChild:
        """A child the caller talks to over its stdin and stdout (text), its stderr kept for the caller to read;
        forked where the fork server can run it. ChildProcessError once the service is closing."""
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - the child's, closed with it
        scratch = tempfile.TemporaryDirectory(prefix="rlctl-child-")
        record = Path(scratch.name) / "exit"
        (in_read, in_write), (out_read, out_write) = os.pipe(), os.pipe()
        started: tuple[int, float, subprocess.Popen[bytes] | None] | None = None
        try:
            self._refuse_when_closed()
            if self.fork_server is not None and runnable(argv, sys.executable):
                request = LaunchRequest(argv, env, str(cwd), None, str(record))
                forked = self.fork_server.launch(
                    request, (out_write, stderr.fileno(), in_read), give_up=lambda: self._closed
                )
                if forked is not None:
                    started = (*forked, None)
            if started is None:
                self._refuse_when_closed()
                popen = subprocess.Popen(
                    list(argv),
                    cwd=cwd,
                    env=dict(env),
                    stdin=in_read,
                    stdout=out_write,
                    stderr=stderr,
                    start_new_session=True,
                )
                started = (popen.pid, 0.0, popen)
            if not self._track(started[0]):
                if started[2] is not None:
                    started[2].wait()  # killed by _track: reaped here
                self._refuse_when_closed()
        except BaseException:
            for fd in (in_write, out_read):
                os.close(fd)
            stderr.close()
            scratch.cleanup()
            raise
        finally:
            os.close(in_read)
            os.close(out_write)
        pid, start_time, started_popen = started

        def release() -> None:
            self._forget(pid)
            scratch.cleanup()

        return PipedChild(
            pid=pid,
            stdin=os.fdopen(in_write, "w", encoding="utf-8"),
            stdout=os.fdopen(out_read, "r", encoding="utf-8"),
            stderr=stderr,
            ended=_fork_ended(record, pid, start_time) if started_popen is None else _popen_ended(started_popen),
            release=release,
        )

    def _track(self, pid: int) -> bool:
        """Count a child just started as running, so close() ends it; a child started while the service closed is
        killed instead (it does not outlive the service): False."""
        with self._lock:
            closing = self._closed
            if not closing:
                self._running.add(pid)
        if closing:
            _kill(pid)
        return not closing

    def _forget(self, pid: int) -> None:
        with self._lock:
            self._running.discard(pid)

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


@dataclass
class PipedChild:
    """A running child of ChildRunner.open: write to `stdin`, read from `stdout`; `stderr` is a file it writes."""

    pid: int
    stdin: IO[str]
    stdout: IO[str]
    stderr: IO[bytes]
    ended: Callable[[float], bool]  # has it ended, waiting up to that many seconds
    release: Callable[[], None]

    def close(self, grace_s: float = 5.0) -> None:
        """End of input; the child is killed if it has not ended within `grace_s`."""
        with contextlib.suppress(OSError):
            self.stdin.close()
        if not self.ended(grace_s):
            _kill(self.pid)
            self.ended(grace_s)
        for stream in (self.stdout, self.stderr):
            with contextlib.suppress(OSError):
                stream.close()
        self.release()


def _popen_ended(popen: subprocess.Popen[bytes]) -> Callable[[float], bool]:
    def ended(wait_s: float) -> bool:
        try:
            popen.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    return ended


def _fork_ended(record: Path, pid: int, start_time: float) -> Callable[[float], bool]:
    def ended(wait_s: float) -> bool:  # the server writes the record once it has reaped the fork
        return read_exit(record, pid, start_time, START_TIME_TOLERANCE_S, wait_s) is not None

    return ended


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
