"""A pre-imported parent that the service's Python children are forked from (docs/RUNS.md#the-fork-server).

Every run starts Python processes that import the same heavy libraries (torch, transformers, atroposlib): seconds
of CPU each, paid again by every run. The fork server imports them once; a process the supervisor asks it for is a
fork of it that then becomes what `python -m MODULE ...` or `python SCRIPT ...` would have been: its own session
and process group, its own stdout and stderr, its own environment (replaced whole), working directory, `sys.argv`
and `sys.path` (its PYTHONPATH entries and their `sitecustomize`, as an interpreter start imports them), and its
command line as `ps` shows it.

The server is a child of the service, spoken to over a socket pair: one message per request (with the caller's
pipes for stdout and stderr when it reads them itself, instead of a log), one per answer. It reaps the processes
it forked and writes each one's exit status where the request says, by default beside its log (`trainer.log` →
`trainer.log.exit`), with the pid and start time that recognise it, so the supervisor reads an exit code it could
not wait for itself, also after a restart of the service. When the service goes (its end of the socket closes)
the server forks nothing more and exits once its last process has.

What a fork inherits from the server and a fresh interpreter would not have: the modules it imported (read with
the server's environment, which is the service's own less its secrets) and the hash seed of `str` keys. Random
generators are seeded again in each fork, and each gets its own of the temporary directories that imported modules
keep for the life of a process; what the server's modules registered to be finalized at exit is left to the server.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import importlib
import io
import json
import logging
import os
import random
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from rlctl.supervisor.start_time import start_time_of

logger = logging.getLogger("rlctl.forkserver")
EXIT_SUFFIX = ".exit"
READY = b"ready"  # then the preload entries that failed, as a JSON list
MAX_MESSAGE = 1 << 20  # a request is one message of the socket pair (an environment is kilobytes)
# An argument of the server's own command line that only makes room in memory for its forks' command lines:
# a fork writes its own there, so `ps` and psutil show what it runs (_show_command).
COMMAND_ROOM = "." * 2048
# How long a fork's exit may take to be recorded once it is gone (the server reaps and writes at once).
EXIT_RECORD_WAIT_S = 30.0
# After a server that did not start (it hung or died importing), requests spawn their processes themselves for
# this long before a new server is tried: each would otherwise wait out the start-up time-out again.
RETRY_AFTER_FAILED_START_S = 60.0
# What a server imports once for the processes of runs forked from it: the trainer's and the environments' heavy
# imports, and the Atropos API (the service's server also forks its own children: rlctl/service/children.py). An entry
# `module:function` also calls that function once imported: work every fork would otherwise repeat.
RUN_PRELOAD = (
    "torch",
    "transformers",
    "peft",
    "atroposlib.envs.base",
    "atroposlib.api",
    # What the three run processes still imported after their fork (a quarter of a run's start-up CPU): the web
    # servers of the API and the trainer, the trainer's own modules, the environment CLI's console output, the
    # HTTP clients' transport, what atroposlib's metrics import, and the tiny local model's architecture.
    "uvicorn.main",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.websockets.auto",
    "uvicorn.lifespan.on",
    "uvicorn.loops.auto",
    "uvloop",
    "httpcore",
    "anyio._backends._asyncio",
    "numpy.ma",
    "rich.console",
    "rich.pretty",
    "rlctl.trainer.loop",
    "rlctl.trajectories.training",  # the shipped environments' text replies as rollouts
    "rlctl.environment_kit.sampling",  # the environments' shared sampling (docs/ENVIRONMENTS.md#shared-helpers)
    "transformers.models.qwen3.modeling_qwen3",
    "rlctl.trainer.backends.local:warm_up",
)
# The server's command-line flag: it and every process it forks die with the server's parent (see below).
DIE_WITH_PARENT_FLAG = "--die-with-parent"
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# How long a request's answer may take (a fork takes milliseconds): past it the server is killed (ForkServer._abandon).
ANSWER_TIMEOUT_S = 60.0
# How often a launch waiting for the server's start (its own or another thread's) asks whether to give up.
GIVE_UP_POLL_S = 0.1


@dataclass(frozen=True)
class LaunchRequest:
    """What to become: `argv` as a command line would give it (`[python, "-m", module, ...]` or `[python, script,
    ...]`), the whole environment and the working directory. Its stdout and stderr are the log at `log_path`, or
    the two descriptors sent with the request (pipes of the caller) when `log_path` is None; a third descriptor
    sent is its stdin (else /dev/null). Its exit is recorded at `exit_path`, by default beside the log."""

    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str
    log_path: str | None
    exit_path: str | None = None

    @property
    def record_path(self) -> Path:
        if self.exit_path is not None:
            return Path(self.exit_path)
        if self.log_path is None:
            raise ValueError("a request without a log names where its exit is recorded")
        return exit_path(Path(self.log_path))

    def encode(self) -> bytes:
        return json.dumps(
            {
                "argv": list(self.argv),
                "env": dict(self.env),
                "cwd": self.cwd,
                "log": self.log_path,
                "exit": str(self.record_path),
            }
        ).encode()

    @classmethod
    def decode(cls, message: bytes) -> LaunchRequest:
        data = json.loads(message)
        return cls(data["argv"], data["env"], data["cwd"], data["log"], data["exit"])


def runnable(argv: Sequence[str], python: str) -> bool:
    """Can the server become this command? Only this interpreter, running a module or a script, without options."""
    return len(argv) >= 2 and argv[0] == python and (argv[1] == "-m" and len(argv) >= 3 or not argv[1].startswith("-"))


def exit_path(log_path: Path) -> Path:
    return log_path.with_name(log_path.name + EXIT_SUFFIX)


def read_exit(record: Path, pid: int, start_time: float, tolerance_s: float, wait_s: float = 0.0) -> int | None:
    """The raw wait status the server recorded at `record` for this process (pid and start time), or None.
    `wait_s`: how long to wait for it, for a process known to have ended (the server writes the record right after
    reaping it, so a reader that saw it gone may be a few milliseconds early)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            recorded = json.loads(record.read_text())
        except (OSError, ValueError):
            recorded = {}
        if recorded.get("pid") == pid and abs(float(recorded.get("start_time", 0)) - start_time) <= tolerance_s:
            return int(recorded["wait_status"])
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


class ForkServer:
    """The service's side: the server is started on first use (or by `start`), and asked one request at a time.

    Any failure (it cannot start, it died, it cannot fork) answers None, and the caller spawns the process itself;
    the next request starts a new server. A start that its caller gave up on goes on: the next request waits for the
    rest of it.
    """

    def __init__(
        self,
        preload: Sequence[str],
        env: Mapping[str, str],
        ready_timeout_s: float = 300.0,
        die_with_parent: bool = False,
        answer_timeout_s: float = ANSWER_TIMEOUT_S,
    ) -> None:
        """`die_with_parent`: the server is killed by the kernel when the thread that starts it ends (its parent's
        death, even by SIGKILL), and so is every process it forks when the server dies: what a node-side supervisor
        on Ray needs of its runs' processes (rlctl/supervisor/node.py). Start it from a thread that lives as long."""
        self.preload = tuple(preload)
        self.dies_with_parent = die_with_parent
        self._env = dict(env)  # the server's own, read by the modules it imports
        self._ready_timeout_s = ready_timeout_s
        self._answer_timeout_s = answer_timeout_s
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._ready = False  # the server behind _sock has said it is ready (its imports done)
        self._start_began = 0.0
        self._failed_start_at: float | None = None
        self.preload_failures: list[str] = []  # of the running server: what each fork imports or does itself

    def start(self) -> bool:
        with self._lock:
            return self._connected()

    def launch(
        self, request: LaunchRequest, stdio: Sequence[int] = (), give_up: Callable[[], bool] | None = None
    ) -> tuple[int, float] | None:
        """The forked process's pid and start time, or None. `stdio`: its stdout and stderr, for a request
        without a log, and optionally its stdin (the caller keeps and closes its own copies). `give_up`: asked
        while the server starts, in this thread or another (seconds of imports); True answers None at once (a
        service that is closing waits for no start; an inference-test model, no longer than its time-out)."""
        while not self._lock.acquire(timeout=GIVE_UP_POLL_S):
            if give_up is not None and give_up():
                return None
        try:
            if not self._connected(give_up):
                return None
            assert self._sock is not None
            try:
                socket.send_fds(self._sock, [request.encode()], list(stdio))
                answer = json.loads(self._sock.recv(MAX_MESSAGE) or b"{}")
            except (OSError, ValueError):
                self._abandon()
                return None
            if "pid" not in answer:
                return None
            return int(answer["pid"]), float(answer["start_time"])
        finally:
            self._lock.release()

    def close(self) -> None:
        """Closes our end: the server forks nothing more and exits once its processes have."""
        with self._lock:
            self._disconnect()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    def _connected(self, give_up: Callable[[], bool] | None = None) -> bool:
        """A ready server, started (or its start waited for) if need be; False when there is none to ask now."""
        if self._sock is None or self._process is None or self._process.poll() is not None:
            if self._sock is not None and not self._ready:  # a start given up on, and the server died since
                self._start_failed()
                return False
            self._disconnect()
            failed_at = self._failed_start_at
            if failed_at is not None and time.monotonic() - failed_at < RETRY_AFTER_FAILED_START_S:
                return False
            if not self._spawn_server():
                self._failed_start_at = time.monotonic()
                return False
        return self._ready or self._await_ready(give_up)

    def _spawn_server(self) -> bool:
        self._start_began = time.monotonic()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            flags = [DIE_WITH_PARENT_FLAG] if self.dies_with_parent else []
            self._process = subprocess.Popen(
                [sys.executable, "-m", "rlctl.supervisor.forkserver", str(theirs.fileno()), COMMAND_ROOM, *flags]
                + list(self.preload),
                preexec_fn=die_with_parent if self.dies_with_parent else None,  # prctl only: safe before exec
                pass_fds=(theirs.fileno(),),
                env=self._env,
                cwd=str(
                    Path(__file__).resolve().parents[2]
                ),  # the repository: `-m rlctl.supervisor...` imports from it
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a stop of the service's group is not the server's: its socket closing is
            )
        except OSError:
            ours.close()
            return False
        finally:
            theirs.close()
        self._sock = ours
        self._ready = False
        return True

    def _await_ready(self, give_up: Callable[[], bool] | None) -> bool:
        """Waits for the starting server's "ready", at most `ready_timeout_s` from its start. False when `give_up`
        says so (the server goes on starting), or when it died or hangs importing (it is killed: it forked
        nothing, so nothing of it is kept)."""
        assert self._sock is not None
        ready_by = self._start_began + self._ready_timeout_s
        while (remaining := ready_by - time.monotonic()) > 0:
            self._sock.settimeout(remaining if give_up is None else min(remaining, GIVE_UP_POLL_S))
            try:
                self._ready = self._read_ready(self._sock.recv(MAX_MESSAGE))
            except TimeoutError:
                if give_up is not None and give_up():
                    return False
                continue
            except (OSError, ValueError):
                break
            if not self._ready:
                break
            self._sock.settimeout(self._answer_timeout_s)
            self._failed_start_at = None
            return True
        self._start_failed()
        return False

    def _start_failed(self) -> None:
        assert self._process is not None
        logger.warning(
            "the fork server did not start (%s after %.1f s): processes are started without it for %g s",
            "exited" if self._process.poll() is not None else "not ready",
            time.monotonic() - self._start_began,
            RETRY_AFTER_FAILED_START_S,
        )
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait()
        self._disconnect()
        self._failed_start_at = time.monotonic()

    def _read_ready(self, message: bytes) -> bool:
        if not message.startswith(READY):
            return False
        self.preload_failures = json.loads(message[len(READY) :] or b"[]")
        if self.preload_failures:  # each fork now pays for what the server could not do once
            logger.warning("the fork server could not preload %s", ", ".join(self.preload_failures))
        return True

    def _abandon(self) -> None:
        """A server that did not answer is killed, not only left: it would still fork the request in its queue
        later, a process nobody knows of, beside the one the caller now starts itself. (Its earlier forks live on,
        their exits no longer recorded: their supervisors read them as ended with no code.)"""
        if self._process is not None:
            if self._process.poll() is None:
                logger.warning("the fork server (pid %d) did not answer a request: killed", self._process.pid)
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()  # not once reaped: its pid may be another process's by then
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=self._answer_timeout_s)
        self._disconnect()

    def _disconnect(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock = None
        self._ready = False
        if self._process is not None and self._process.poll() is not None:
            self._process = None


# --- the server ---


def serve(sock: socket.socket, preload: Sequence[str], forks_die_with_server: bool = False) -> None:
    failures = [entry for entry in preload if not _preloaded(entry)]
    _IMPORTED_TEMP_DIRS[:] = _module_temp_dirs()
    # What the preload made is the forks' too: frozen, no collection in a fork walks it. Walking it writes to
    # every object's header, and each page written is a copy: a full collection in a trainer's start-up copied
    # 140 MB of the server's memory and tripled its CPU (docs/RUNS.md#the-fork-server). (No collection first: it
    # takes a quarter of a second and finds a few dozen objects.)
    gc.freeze()
    children: dict[int, tuple[Path, float]] = {}
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD wakes the loop through the fd
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the service's group stop is not ours: its socket closing is
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock.sendall(READY + json.dumps(failures).encode())
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wakeup_read, selectors.EVENT_READ)
    connected = True
    while connected or children:
        for key, _ in selector.select():
            if key.fileobj is sock:
                message, stdio, _flags, _address = socket.recv_fds(sock, MAX_MESSAGE, 3)
                if not message:
                    connected = False
                    selector.unregister(sock)
                    continue
                server_fds = (sock.fileno(), wakeup_read, wakeup_write)
                answer = _fork(LaunchRequest.decode(message), stdio, children, server_fds, forks_die_with_server)
                for fd in stdio:
                    os.close(fd)
                with contextlib.suppress(OSError):
                    sock.sendall(json.dumps(answer).encode())
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(wakeup_read, 4096)
        _reap(children)


def _preloaded(entry: str) -> bool:
    """Imports `module` of an entry `module` or `module:function`, and calls the function; False if that failed
    (the forks then import, or do, it themselves)."""
    module, _, function = entry.partition(":")
    try:
        loaded = importlib.import_module(module)
        if function:
            getattr(loaded, function)()
    except Exception:  # noqa: BLE001 - whatever a module raises, the server still serves
        return False
    return True


def _fork(
    request: LaunchRequest,
    stdio: Sequence[int],
    children: dict[int, tuple[Path, float]],
    server_fds: tuple[int, ...],
    die_with_server: bool,
) -> dict[str, object]:
    for stream in (sys.stdout, sys.stderr):  # nothing of ours may be flushed into the child's log
        stream.flush()
    server_pid = os.getpid()
    # The answer waits for the fork's setsid (its end of this pipe closes then): a caller that kills the session
    # named by the answered pid at once would otherwise miss a fork still in ours, and the fork would live on.
    in_session_read, in_session_write = os.pipe()
    try:
        pid = os.fork()
    except OSError as error:
        os.close(in_session_read)
        os.close(in_session_write)
        return {"error": f"fork failed: {error}"}
    if pid == 0:  # the child: never returns
        os.close(in_session_read)
        if die_with_server:
            die_with_parent()
            if os.getppid() != server_pid:  # the server died before the kernel was told: as if it had after
                os._exit(1)
        _become(request, stdio, server_fds, in_session_write)
    os.close(in_session_write)
    os.read(in_session_read, 1)  # end of file: the fork leads its session, or is gone
    os.close(in_session_read)
    try:
        start_time = start_time_of(pid)
    except psutil.Error:
        start_time = 0.0
    children[pid] = (request.record_path, start_time)
    return {"pid": pid, "start_time": start_time}


def _reap(children: dict[int, tuple[Path, float]]) -> None:
    while children:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        if pid in children:
            target, start_time = children.pop(pid)
            _record_exit(target, pid, start_time, wait_status)


def _record_exit(target: Path, pid: int, start_time: float, wait_status: int) -> None:
    """Written whole or not at all: a reader never sees half a record."""
    record = json.dumps({"pid": pid, "start_time": start_time, "wait_status": wait_status})
    with contextlib.suppress(OSError):
        scratch = target.with_name(f".{target.name}.{pid}")
        scratch.write_text(record)
        scratch.replace(target)


# Temporary directories that imported modules made for the life of the process (wandb's media folder,
# `wandb.sdk.data_types._private.MEDIA_TMP`): (module, attribute) of each, found once after the preload.
_IMPORTED_TEMP_DIRS: list[tuple[str, str]] = []


def _module_temp_dirs() -> list[tuple[str, str]]:
    found = []
    for name, module in list(sys.modules.items()):
        try:
            attributes = list(vars(module).items())
        except TypeError:
            continue
        found += [
            (name, attribute) for attribute, value in attributes if isinstance(value, tempfile.TemporaryDirectory)
        ]
    return found


# --- the child ---


def _own_temp_dirs() -> None:
    """A fork gets its own of each: shared, the first fork to exit would delete it under the others (its
    finalizer runs at exit). The inherited one is the server's (`_leave_finalizers_to_the_server`)."""
    for name, attribute in _IMPORTED_TEMP_DIRS:
        module = sys.modules.get(name)
        if isinstance(getattr(module, attribute, None), tempfile.TemporaryDirectory):
            setattr(module, attribute, tempfile.TemporaryDirectory())


def _leave_finalizers_to_the_server() -> None:
    """What the preload registered to be finalized is the server's, never run in a fork, at its exit or when it
    drops the object: the temporary directories imported modules keep (run, they deleted the server's), and
    torch's operator libraries, about 180 (run at each fork's exit, they unregistered operators in memory the fork
    had to copy first: 30 to 50 ms of CPU as it ended). A fork's own finalizers still run."""
    for finalizer in list(getattr(weakref.finalize, "_registry", {})):
        finalizer.detach()


def _become(request: LaunchRequest, stdio: Sequence[int], server_fds: tuple[int, ...], in_session: int) -> None:
    code = 1
    try:
        _detach(request, stdio, server_fds, in_session)
        code = _run(request.argv)
    except BaseException:  # noqa: BLE001 - whatever happens, this process must not return into the server's loop
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        _exit(code)


def _detach(request: LaunchRequest, stdio: Sequence[int], server_fds: tuple[int, ...], in_session: int) -> None:
    """Everything an exec would have given a fresh process, less the imports. `in_session` is closed once the
    process leads a session of its own: the server answers then."""
    os.setsid()
    os.close(in_session)
    signal.set_wakeup_fd(-1)
    for number in (signal.SIGCHLD, signal.SIGTERM):  # as a fresh interpreter has them (SIGPIPE stays ignored)
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd in server_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    if len(stdio) > 2:
        os.dup2(stdio[2], 0)
    else:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    if request.log_path is not None:
        log = os.open(request.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        outputs: Sequence[int] = (log, log)
    else:
        outputs = stdio
    os.dup2(outputs[0], 1)
    os.dup2(outputs[1], 2)
    for fd in {*outputs, *stdio}:  # received descriptors are above 2: each is in place by now
        os.close(fd)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    unbuffered = bool(request.env.get("PYTHONUNBUFFERED"))
    sys.stdout = _text_stream(1, unbuffered)
    sys.stderr = _text_stream(2, True)
    with contextlib.suppress(Exception):  # cosmetic: a kernel that does not show it changes nothing else
        _show_command(request.argv)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    _leave_finalizers_to_the_server()
    _own_temp_dirs()


def _show_command(argv: Sequence[str]) -> None:
    """Write the command line over the server's own in this process's memory, as setproctitle does on Linux:
    the words joined by spaces, then a NUL, then spaces up to the end, so the kernel's /proc/PID/cmdline reads up
    to the NUL (its rule for a rewritten command line) and psutil splits the words at the spaces."""
    stat = Path("/proc/self/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end: fields 48 and 49 of proc(5)
    room = end - start
    text = " ".join(argv).encode()[: room - 2]
    ctypes.memmove(start, text + b"\0" + b" " * (room - len(text) - 1), room)


def _text_stream(fd: int, write_through: bool) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.FileIO(fd, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
        write_through=write_through,
    )


def _run(argv: Sequence[str]) -> int:
    module = argv[2] if argv[1] == "-m" else None
    first = os.getcwd() if module else os.path.dirname(os.path.abspath(argv[1]))
    extra = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:] = [first, *extra, *[entry for entry in sys.path[1:] if entry not in extra]]
    if extra and any(Path(entry, "sitecustomize.py").is_file() for entry in extra):
        sys.modules.pop("sitecustomize", None)
        importlib.import_module("sitecustomize")
    try:
        if module:
            sys.argv = [module, *argv[3:]]  # run_module puts the module's file in argv[0]
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv[1:])
            runpy.run_path(argv[1], run_name="__main__")
    except SystemExit as exit_request:
        return _exit_code(exit_request.code)
    return 0


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(BaseException):
        print(code, file=sys.stderr)
    return 1


def _exit(code: int) -> None:
    """As an interpreter ends: wait for the threads that are not daemons, run the exit handlers, flush."""
    with contextlib.suppress(BaseException):
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    with contextlib.suppress(BaseException):
        import atexit  # noqa: PLC0415

        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code)


def die_with_parent() -> None:
    """SIGKILL from the kernel when the thread that started this process ends (its parent's death, even by SIGKILL).
    Safe between fork and exec: one system call."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def main(argv: list[str] | None = None) -> int:
    """`python -m rlctl.supervisor.forkserver FD ROOM [--die-with-parent] MODULE...`: serve on the inherited socket FD
    after importing the MODULEs (ROOM: COMMAND_ROOM)."""
    args = argv if argv is not None else sys.argv[1:]
    sock = socket.socket(fileno=int(args[0]))
    preload = args[2:]
    forks_die_with_server = bool(preload) and preload[0] == DIE_WITH_PARENT_FLAG
    try:
        serve(sock, preload[1:] if forks_die_with_server else preload, forks_die_with_server)
    except OSError as error:
        if error.errno != errno.EPIPE:
            raise
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
