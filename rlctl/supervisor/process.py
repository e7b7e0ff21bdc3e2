"""One supervised process: its own process group, its own log file, recognised by pid + start time.

A process is signalled only when its pid still belongs to the process that was started (the start time
matches): a pid reused by an unrelated process is never touched.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import IO

import psutil

from rlctl.supervisor.forkserver import (
    EXIT_RECORD_WAIT_S,
    ForkServer,
    LaunchRequest,
    die_with_parent,
    exit_path,
    read_exit,
    runnable,
)
from rlctl.supervisor.start_time import start_time_of, started_at

START_TIME_TOLERANCE_S = 0.05
# The variable that says which GPUs a process sees: set in a spec's env by the executors (local.py, node.py).
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


class Liveness(Enum):
    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    pgid: int
    start_time: float


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended; both None when it ended out of our sight (adopted, exit code unknown)."""

    code: int | None = None
    signal: int | None = None

    @property
    def clean(self) -> bool:
        return self.code == 0

    def describe(self) -> str:
        if self.signal is not None:
            return f"killed by signal {signal.Signals(self.signal).name}"
        if self.code is not None:
            return f"exited with code {self.code}"
        return "exited (exit code unknown: it ended while not a child of this service)"


@dataclass(frozen=True)
class ProcessSpec:
    role: str
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: Path
    log_path: Path
    ready: Callable[[], bool] | None = None  # answers True once the process serves
    ready_timeout_s: float = 60.0
    # The roles that must be ready before this process is spawned (docs/RUNS.md#process-order); None: the process
    # before it in the plan (each waits for its predecessor), () : at once.
    after: tuple[str, ...] | None = None
    # Roles that must be ready before this one's readiness is probed: it cannot be ready sooner, and its probe
    # would only load them (the environment's probe asks the API, which answers 500 until an env registers).
    probe_after: tuple[str, ...] = ()
    # Killed by the kernel when the supervising process dies, even by SIGKILL (Linux PR_SET_PDEATHSIG): a node-side
    # supervisor on Ray (rlctl/supervisor/node.py) has no service that would re-adopt its processes after its death.
    die_with_parent: bool = False


def identity_liveness(identity: ProcessIdentity) -> Liveness:
    """Is the process that was started still there? A reused pid counts as dead; no permission is unknown."""
    try:
        if _started_otherwise(identity):
            return Liveness.DEAD
        if psutil.Process(identity.pid).status() == psutil.STATUS_ZOMBIE:
            return Liveness.DEAD
        return Liveness.ALIVE
    except psutil.NoSuchProcess:
        return Liveness.DEAD
    except (psutil.AccessDenied, OSError):
        return Liveness.UNKNOWN


class SupervisedProcess:
    def __init__(
        self,
        role: str,
        identity: ProcessIdentity,
        log_path: Path,
        popen: subprocess.Popen[bytes] | None,
        forked: bool = False,
    ) -> None:
        self.role = role
        self.identity = identity
        self.log_path = log_path
        self._popen = popen
        self._forked = forked  # by a fork server (rlctl/supervisor/forkserver.py), which reaps it and records its exit
        self._exit: ExitStatus | None = None

    @classmethod
    def spawn(cls, spec: ProcessSpec, fork_server: ForkServer | None = None) -> SupervisedProcess:
        """A new process, its output appended to its log; forked from the fork server when one is given and can
        run the command, else started."""
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        if (forked := cls._fork(spec, fork_server, log=True, stdio=())) is not None:
            return forked
        with spec.log_path.open("ab") as log:
            return cls._start(spec, log.fileno())

    @classmethod
    def spawn_piped(
        cls, spec: ProcessSpec, fork_server: ForkServer | None = None, give_up: Callable[[], bool] | None = None
    ) -> tuple[SupervisedProcess, IO[bytes]]:
        """As `spawn`, but stdout and stderr go to one pipe whose reading end the caller gets (to scrub what it
        writes to the log itself); a fork's exit is still recorded beside `spec.log_path`. `give_up`: asked while
        the fork server starts in another thread (seconds of imports); True starts the process itself at once."""
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        read_end, write_end = os.pipe()
        try:
            process = cls._fork(spec, fork_server, log=False, stdio=(write_end, write_end), give_up=give_up)
            if process is None:
                process = cls._start(spec, write_end)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        return process, os.fdopen(read_end, "rb")

    @classmethod
    def _fork(
        cls,
        spec: ProcessSpec,
        fork_server: ForkServer | None,
        log: bool,
        stdio: tuple[int, ...],
        give_up: Callable[[], bool] | None = None,
    ) -> SupervisedProcess | None:
        if fork_server is None or not runnable(spec.argv, sys.executable):
            return None
        if spec.die_with_parent and not fork_server.dies_with_parent:  # the service's server outlives its service
            return None
        log_path = str(spec.log_path) if log else None
        request = LaunchRequest(spec.argv, spec.env, str(spec.cwd), log_path, str(exit_path(spec.log_path)))
        if (forked := fork_server.launch(request, stdio, give_up)) is None:
            return None
        pid, start_time = forked
        return cls(spec.role, ProcessIdentity(pid, pid, start_time), spec.log_path, None, forked=True)

    @classmethod
    def _start(cls, spec: ProcessSpec, output: int) -> SupervisedProcess:
        popen = subprocess.Popen(
            list(spec.argv),
            cwd=spec.cwd,
            env=dict(spec.env),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own session and process group: signals reach the whole tree
            close_fds=True,
            preexec_fn=die_with_parent if spec.die_with_parent else None,  # prctl only: safe before exec
        )
        try:
            start_time = start_time_of(popen.pid)
        except psutil.NoSuchProcess:  # already ended and reaped: its start was a moment ago
            start_time = time.clock_gettime(time.CLOCK_BOOTTIME)
        return cls(spec.role, ProcessIdentity(popen.pid, popen.pid, start_time), spec.log_path, popen)

    @classmethod
    def adopt(
        cls, role: str, identity: ProcessIdentity, log_path: Path, exited: ExitStatus | None = None
    ) -> SupervisedProcess:
        """A process started by an earlier run of the service (its parent is gone; we cannot reap it).

        `exited` is the exit already recorded for it, if any.
        """
        process = cls(role, identity, log_path, popen=None)
        process._exit = exited
        return process

    def poll(self) -> ExitStatus | None:
        """None while running; the exit status once it has ended (the code unknown for an adopted process that
        no fork server recorded)."""
        if self._exit is not None:
            return self._exit
        if self._popen is not None:
            code = self._popen.poll()
            if code is not None:
                self._exit = _status_from_returncode(code)
            return self._exit
        if (recorded := self._recorded_exit()) is not None:
            self._exit = recorded
        elif self._forked and _zombie(self.identity.pid):
            return None  # ended, but the fork server has not reaped it and written its exit yet
        elif identity_liveness(self.identity) is Liveness.DEAD:
            # reaped: a fork's record is being written (an adopted process may have none: one more look)
            wait_s = EXIT_RECORD_WAIT_S if self._forked else 0.0
            self._exit = self._recorded_exit(wait_s) or ExitStatus()
        return self._exit

    def wait(self, timeout_s: float) -> ExitStatus | None:
        """As `poll`, after waiting at most `timeout_s` for the process to end. Its end wakes the wait (the child's
        own wait, or a pidfd for a fork or an adopted process), so a caller polling in a loop sees it at once."""
        if (status := self.poll()) is not None:
            return status
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout_s)
        elif _await_end(self.identity, timeout_s) and self._forked:
            # Its server reaps it and records its exit right away: until then poll() sees a zombie.
            self._exit = self._recorded_exit(EXIT_RECORD_WAIT_S)
        return self.poll()

    def _recorded_exit(self, wait_s: float = 0.0) -> ExitStatus | None:
        record = exit_path(self.log_path)
        status = read_exit(record, self.identity.pid, self.identity.start_time, START_TIME_TOLERANCE_S, wait_s)
        return None if status is None else status_from_wait(status)

    def liveness(self) -> Liveness:
        if self.poll() is not None:
            return Liveness.DEAD
        return identity_liveness(self.identity)

    def terminate(self, grace_s: float) -> ExitStatus | None:
        """SIGTERM to the group, SIGKILL after the grace period, reap, and wait until no member is left."""
        if self.poll() is None or self._group_alive():
            self._signal_group(signal.SIGTERM)
            if not _wait(self._gone, grace_s):
                self._signal_group(signal.SIGKILL)
                _wait(self._gone, 10.0)
        return self.poll()

    def _gone(self) -> bool:
        return self.poll() is not None and not self._group_alive()

    def _group_alive(self) -> bool:
        """Members of our group are left. Not once the leader is gone and its pid is another process's: the kernel
        does not hand out pid G while group G has members, so our group is empty and group G is someone else's."""
        if _pid_reused(self.identity):
            return False
        return bool(live_group_members(self.identity.pgid))

    def _signal_group(self, sig: signal.Signals) -> None:
        if not self._may_signal_group():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.identity.pgid, sig)

    def _may_signal_group(self) -> bool:
        """Our group only: the leader is the process we started, or it is gone and its pid not reused.

        While any member of group G lives, the kernel does not hand out pid G again; once the group is empty
        the id may belong to someone else's new group. Unknown liveness (no permission) signals nothing.
        """
        leader = identity_liveness(self.identity)
        if leader is Liveness.ALIVE:
            return True
        if leader is Liveness.UNKNOWN:
            return False
        return self._group_alive()


def _pid_reused(identity: ProcessIdentity) -> bool:
    """The leader's pid belongs to a process started at another time (our leader, even a zombie, is not reused)."""
    try:
        return _started_otherwise(identity)
    except (psutil.Error, OSError):  # gone (then not reused), or not ours to look at
        return False


def _started_otherwise(identity: ProcessIdentity) -> bool:
    """Is the process now at identity's pid another one than the process identity names? Its start time says."""
    return not started_at(identity.pid, identity.start_time, START_TIME_TOLERANCE_S)


def _await_end(identity: ProcessIdentity, timeout_s: float) -> bool:
    """Waits at most `timeout_s` for the process to end (zombie or reaped); whether it has. A pidfd wakes at the end
    of any process, not only of a child; without pidfds (Linux before 5.3) the time-out is slept out."""
    try:
        pidfd = os.pidfd_open(identity.pid)
    except ProcessLookupError:
        return True
    except OSError:
        time.sleep(timeout_s)
        return identity_liveness(identity) is Liveness.DEAD
    try:
        if _pid_reused(identity):  # the pidfd is of the process now at that pid: ours had ended before
            return True
        return bool(select.select([pidfd], [], [], timeout_s)[0])
    finally:
        os.close(pidfd)


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def live_group_members(pgid: int) -> list[int]:
    """Pids of the group's members that are not zombies."""
    members = []
    for process in psutil.process_iter(["status"]):
        try:
            if process.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(process.pid) == pgid:
                members.append(process.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def status_from_wait(wait_status: int) -> ExitStatus:
    """A raw wait status (os.waitpid) as an ExitStatus."""
    if os.WIFSIGNALED(wait_status):
        return ExitStatus(signal=os.WTERMSIG(wait_status))
    return ExitStatus(code=os.waitstatus_to_exitcode(wait_status))


def _status_from_returncode(code: int) -> ExitStatus:
    return ExitStatus(signal=-code) if code < 0 else ExitStatus(code=code)


def _wait(condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
