"""The isolation of the `terminal` tool: bubblewrap (`bwrap`), Debian's unprivileged sandboxing tool.

Why bubblewrap: it is a small, audited program (Flatpak's sandbox) packaged by Debian, that needs no daemon, no
configuration file and no privilege of its own (it uses user namespaces), and it does one thing: start a command
in fresh mount, PID, IPC, UTS, network (and cgroup) namespaces, with only the paths it is told to show.

What a command sees: `/usr` (and the `/bin`, `/lib` links into it) read-only, a private `/proc` of its own PID
namespace, a minimal `/dev`, an empty `/tmp`, and its work directory as `/work`, the only writable path. No
network (only a loopback of its own), no environment variable of the service (`--clearenv`; PATH, HOME, LANG
and TERM are set), none of its files, database or processes. It runs as an unprivileged user inside a user
namespace of its own, with no capability, under process, address-space, CPU-time, file-size and open-file limits
(`prlimit`): a process limit counted inside that namespace, so a fork bomb stops at `processes` and other items
are not affected. `--die-with-parent` and the PID namespace make the end of a call the end of every process
it started: when the command's first process ends or is killed, the kernel kills the rest of the namespace.

When the service runs as root, bwrap runs in its privileged mode and the command is then dropped (`setpriv`) to
an unprivileged user (`sandbox_uid`) that enters a user namespace of its own (`unshare --user`), since a user
namespace mapped to root would not count processes. Otherwise bwrap makes the user namespace itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from service.errors import Conflict

WORKDIR = "/work"
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
INNER_UID = 1000  # the user a command is inside its namespace
PROBE_TIMEOUT_S = 20


@dataclass(frozen=True)
class SandboxLimits:
    """Per call of `terminal`; `disk_bytes` bounds the whole work directory of an item."""

    processes: int = 64
    address_space_bytes: int = 2 << 30
    cpu_s: int = 600
    file_bytes: int = 64 << 20
    open_files: int = 256
    disk_bytes: int = 256 << 20


LIMITS = SandboxLimits()


class SandboxUnavailable(Conflict):
    """`terminal` was asked for where no sandbox can be made; it never runs unsandboxed."""

    code = "SANDBOX_UNAVAILABLE"


@dataclass(frozen=True)
class Sandbox:
    bwrap: str  # the resolved path of the bwrap program
    drop_to_uid: int | None  # set when the service runs as root
    limits: SandboxLimits = LIMITS

    def prepare(self, workdir: Path) -> None:
        """Makes the work directory the sandbox user's (when the service is root, it writes as another user)."""
        if self.drop_to_uid is not None:
            os.chown(workdir, self.drop_to_uid, self.drop_to_uid)

    def argv(self, workdir: Path, command: str) -> list[str]:
        return [*self._bwrap(workdir), *self._inner(), "/bin/bash", "-c", command]

    def popen(self, workdir: Path, command: str) -> subprocess.Popen[bytes]:
        """The command started in the sandbox, its own process group, output (both streams) on one pipe."""
        return subprocess.Popen(
            self.argv(workdir, command),
            env={},  # bwrap needs nothing; the command's environment is set with --setenv
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _bwrap(self, workdir: Path) -> list[str]:
        if self.drop_to_uid is not None:
            # Privileged mode: bwrap makes every namespace but the user one, which the command makes after it
            # has dropped root (below).
            namespaces = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        else:
            namespaces = ["--unshare-all", "--unshare-user", "--disable-userns"]
            namespaces += ["--uid", str(INNER_UID), "--gid", str(INNER_UID)]
        mounts = ["--ro-bind", "/usr", "/usr"]
        for name in ("bin", "lib", "lib64", "sbin"):
            if Path(f"/{name}").is_symlink():  # merged /usr (Debian 12): /bin -> usr/bin
                mounts += ["--symlink", f"usr/{name}", f"/{name}"]
            elif Path(f"/{name}").is_dir():
                mounts += ["--ro-bind", f"/{name}", f"/{name}"]
        for shared in ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime"):
            mounts += ["--ro-bind-try", shared, shared]
        mounts += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", str(workdir), WORKDIR]
        environment = ["--clearenv", "--setenv", "PATH", SANDBOX_PATH, "--setenv", "HOME", WORKDIR]
        environment += ["--setenv", "LANG", "C.UTF-8", "--setenv", "TERM", "dumb"]
        return [
            self.bwrap,
            *namespaces,
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
            *mounts,
            "--chdir",
            WORKDIR,
            *environment,
            "--",
        ]

    def _inner(self) -> list[str]:
        limits = self.limits
        prlimit = [
            "/usr/bin/prlimit",
            f"--nproc={limits.processes}",
            f"--as={limits.address_space_bytes}",
            f"--cpu={limits.cpu_s}",
            f"--fsize={limits.file_bytes}",
            f"--nofile={limits.open_files}",
            "--core=0",
            "--",
        ]
        if self.drop_to_uid is None:
            return prlimit
        uid = str(self.drop_to_uid)
        drop = ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all"]
        drop += ["--bounding-set=-all", "--no-new-privs", "--"]
        userns = ["/usr/bin/unshare", "--user", f"--map-user={INNER_UID}", f"--map-group={INNER_UID}", "--"]
        return [*drop, *userns, *prlimit]


_probed: dict[tuple[str, int | None], Sandbox | str] = {}
_probe_lock = threading.Lock()


def find_sandbox(bwrap: str, sandbox_uid: int) -> Sandbox | str:
    """The sandbox, or why none can be made here; probed once (a real command in a real sandbox) and remembered."""
    path = shutil.which(bwrap)
    if path is None:
        return f"the sandbox program {bwrap!r} is not installed (Debian package: bubblewrap)"
    drop = sandbox_uid if os.geteuid() == 0 else None
    key = (path, drop)
    with _probe_lock:
        if key not in _probed:
            _probed[key] = _probe(Sandbox(path, drop))
        return _probed[key]


def require_sandbox(bwrap: str, sandbox_uid: int) -> Sandbox:
    found = find_sandbox(bwrap, sandbox_uid)
    if isinstance(found, str):
        raise SandboxUnavailable(
            f"the terminal tool needs a sandbox and none can be made here: {found}", {"tool": "terminal"}
        )
    return found


def _probe(sandbox: Sandbox) -> Sandbox | str:
    with tempfile.TemporaryDirectory(prefix="rlctl-sandbox-probe-") as scratch:
        workdir = Path(scratch)
        sandbox.prepare(workdir)
        try:
            done = subprocess.run(
                sandbox.argv(workdir, "echo probe > probe.txt"),
                env={},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=PROBE_TIMEOUT_S,
                start_new_session=True,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"{type(error).__name__}: {error}"
        if done.returncode != 0 or not (workdir / "probe.txt").is_file():
            output = (done.stdout + done.stderr).decode("utf-8", "replace").strip()[-500:]
            return f"a test command in the sandbox failed (exit {done.returncode}): {output}"
    return sandbox
