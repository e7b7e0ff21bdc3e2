"""The isolation of the `terminal` tool: bubblewrap (`bwrap`), Debian's unprivileged sandboxing tool.

Why bubblewrap: it is a small, audited program (Flatpak's sandbox) packaged by Debian, that needs no daemon, no
configuration file and no privilege of its own (it uses user namespaces), and it does one thing: start a command
in fresh mount, PID, IPC, UTS, network (and cgroup) namespaces, with only the paths it is told to show.

What a command sees: `/usr` (and the `/bin`, `/lib` links into it) read-only, a private `/proc` of its own PID
namespace, a minimal `/dev`, an empty `/tmp`, and its work directory as `/work`, the only writable path. No
network (only a loopback of its own) unless its caller names destinations (netgate.py), no environment variable
of the service (`--clearenv`; PATH, HOME, LANG and TERM are set), none of its files, database or processes. It
runs as an unprivileged user inside a user namespace of its own that cannot make another (`--disable-userns`),
with no capability, under a seccomp filter (seccomp.py), under process, address-space, CPU-time, file-size and
open-file limits (`prlimit`): a process limit counted inside that namespace, so a fork bomb stops at `processes`
and other calls are not affected, and under a memory cgroup of its own where the service may make one
(memcap.py). `--die-with-parent` and the PID namespace make the end of a call the end of every process it
started: when the command's first process ends or is killed, the kernel kills the rest of the namespace.

When the service runs as root, the sandbox's bwrap is still started as an unprivileged user (`sandbox_uid`, by
`setpriv`, with no capability and `no_new_privs`), so that it works exactly as for any other user: a user
namespace mapped to root would neither count processes apart nor be a boundary worth the name. A first,
privileged bwrap only shows it the paths it binds (the service's directories may be closed to that user).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from rlctl.sandbox.errors import NetworkUnavailable, SandboxUnavailable
from rlctl.sandbox.itemdisk import MAX_INODES, ItemDisk, start_item_disk
from rlctl.sandbox.memcap import CallCgroup, CgroupRoot, find_cgroup_root
from rlctl.sandbox.netgate import RELAY, Gate, NetworkPolicy, relay_python
from rlctl.sandbox.quotas import ItemQuota
from rlctl.sandbox.seccomp import build_filter, native_arch
from rlctl.sandbox.workdir import WorkDir, remove_tree

WORKDIR = "/work"
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
INNER_UID = 1000  # the user a command is inside its namespace
PROBE_TIMEOUT_S = 20


@dataclass(frozen=True)
class SandboxLimits:
    """Per call of `terminal`; `disk_bytes` bounds the whole work directory of an item."""

    processes: int = 64
    address_space_bytes: int = 2 << 30
    memory_bytes: int = 1 << 30  # the whole call, where a memory cgroup can be made (memcap.py)
    cpu_s: int = 600
    file_bytes: int = 64 << 20
    open_files: int = 256
    disk_bytes: int = 256 << 20
    disk_inodes: int = MAX_INODES  # files and directories of an item's work directory (where it is a tmpfs)
    tmp_bytes: int = 256 << 20  # the sandbox's /tmp (a tmpfs: memory, also counted by the memory cgroup)


LIMITS = SandboxLimits()


@dataclass(frozen=True)
class Sandbox:
    bwrap: str  # the resolved path of the bwrap program
    drop_to_uid: int | None  # set when the service runs as root
    limits: SandboxLimits = LIMITS
    cgroup: CgroupRoot | None = None  # where call memory cgroups are made; None: rlimits only
    seccomp: bytes = field(default=b"", repr=False)  # the BPF program bwrap loads

    @property
    def memory_mode(self) -> str:
        """Which memory limit applies: `cgroup2`, `cgroup1` (the whole call) or `rlimit` (per process)."""
        return self.cgroup.kind if self.cgroup else "rlimit"

    def prepare(self, workdir: Path) -> None:
        """Makes the work directory the sandbox user's (when the service is root, it writes as another user)."""
        if self.drop_to_uid is not None:
            os.chown(workdir, self.drop_to_uid, self.drop_to_uid)

    def start(
        self,
        workdir: Path,
        command: str,
        network: NetworkPolicy | None = None,
        disk: ItemDisk | None = None,
        quota: ItemQuota | None = None,
    ) -> SandboxCall:
        """The command started in the sandbox (see SandboxCall); `network`: the destinations it may reach; `disk`:
        the item's tmpfs, mounted at `workdir` in its keeper's namespace, which the call joins; `quota`: the
        item's cgroups (quotas.py), under which the call's own is made."""
        return SandboxCall(self, workdir, command, network, disk, quota)

    def item(self, root: Path, quota: ItemQuota | None = None) -> SandboxItem:
        """The kept sandbox of one item (an episode): its work directory at `root` (an empty directory), a tmpfs
        of its own where one can be made, and its calls, in the item's cgroups `quota` where given; close it (or
        leave its `with` block) when the item ends."""
        return SandboxItem(self, root, quota)

    def argv(
        self,
        workdir: Path,
        command: str,
        seccomp_fd: int,
        gate: Gate | None = None,
        group: CallCgroup | None = None,
        disk: ItemDisk | None = None,
        join: tuple[Path, ...] = (),
    ) -> list[str]:
        """The command line of a call (`seccomp_fd`: an open descriptor of the filter, passed to the call;
        `join`: the `cgroup.procs` of further cgroups its processes belong to, e.g. its collection's CPU quota)."""
        outer: list[str] = []
        procs = ([group.procs] if group is not None else []) + list(join)
        for path in procs:  # the call's first process joins its cgroups before anything of the sandbox starts
            outer += ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(path)]
        if disk is not None:  # then the item's mount namespace, where `workdir` is its tmpfs
            outer += disk.enter()
        binds = [(str(workdir), WORKDIR, "--bind")]
        binds += [(here, there, "--ro-bind") for here, there in (gate.binds() if gate else [])]
        if self.drop_to_uid is not None:
            outer += self._view(binds)
            binds = [(there, there, flag) for _here, there, flag in binds]  # the view shows them there
        inner = self._prlimit()
        if gate is not None:
            python = relay_python()
            if python is None:
                raise NetworkUnavailable("no Python interpreter under /usr for the sandbox's network relay")
            inner += [python, "-I", "-S", "-c", RELAY, gate.relay_spec()]
        variables = {"PATH": SANDBOX_PATH, "HOME": WORKDIR, "LANG": "C.UTF-8", "TERM": "dumb"}
        variables |= gate.environment() if gate else {}
        return [*outer, *self._bwrap(binds, variables, seccomp_fd), *inner, "/bin/bash", "-c", command]

    def _view(self, binds: list[tuple[str, str, str]]) -> list[str]:
        """As root: a first, privileged bwrap that only makes a mount namespace showing the paths the sandbox
        binds where an unprivileged user reaches them (the service's directories may be closed to others), and
        starts the sandbox's own bwrap there as `sandbox_uid`, without capabilities."""
        uid = str(self.drop_to_uid)
        view = [self.bwrap, "--die-with-parent", "--perms", "0755", "--dir", "/etc", "--perms", "0755", "--dir", "/run"]
        view += self._system_mounts()
        # The host's /proc (the sandbox's bwrap needs one fully visible to mount its own), and the /tmp it builds
        # its new root in; only bwrap and setpriv run in this view, never the command.
        view += ["--bind", "/proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for here, there, flag in binds:
            view += [flag, here, there]
        drop = ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all"]
        return [*view, "--", *drop, "--bounding-set=-all", "--no-new-privs", "--"]

    def _system_mounts(self) -> list[str]:
        mounts = ["--ro-bind", "/usr", "/usr"]
        for name in ("bin", "lib", "lib64", "sbin"):
            if Path(f"/{name}").is_symlink():  # merged /usr (Debian 12): /bin -> usr/bin
                mounts += ["--symlink", f"usr/{name}", f"/{name}"]
            elif Path(f"/{name}").is_dir():
                mounts += ["--ro-bind", f"/{name}", f"/{name}"]
        for shared in ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime"):
            mounts += ["--ro-bind-try", shared, shared]
        return mounts

    def _bwrap(self, binds: list[tuple[str, str, str]], variables: dict[str, str], seccomp_fd: int) -> list[str]:
        namespaces = ["--unshare-all", "--unshare-user", "--disable-userns"]  # --unshare-all: net too
        namespaces += ["--uid", str(INNER_UID), "--gid", str(INNER_UID)]
        mounts = self._system_mounts()
        mounts += ["--proc", "/proc", "--dev", "/dev", "--size", str(self.limits.tmp_bytes), "--tmpfs", "/tmp"]
        for here, there, flag in binds:
            mounts += [flag, here, there]
        mounts += ["--remount-ro", "/"]  # the new root is a tmpfs of the sandbox's user: no writing (nor filling) it
        environment = ["--clearenv"]
        for name, value in variables.items():
            environment += ["--setenv", name, value]
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
            "--seccomp",
            str(seccomp_fd),
            "--",
        ]

    def _prlimit(self) -> list[str]:
        limits = self.limits
        return [
            "/usr/bin/prlimit",
            f"--nproc={limits.processes}",
            f"--as={limits.address_space_bytes}",
            f"--cpu={limits.cpu_s}",
            f"--fsize={limits.file_bytes}",
            f"--nofile={limits.open_files}",
            "--core=0",
            "--",
        ]


class SandboxCall:
    """One command in the sandbox: its process (its own process group, both output streams on one pipe), its
    memory cgroup and its network gate, all ended by `close` (or leaving the `with` block)."""

    def __init__(
        self,
        sandbox: Sandbox,
        workdir: Path,
        command: str,
        network: NetworkPolicy | None,
        disk: ItemDisk | None = None,
        quota: ItemQuota | None = None,
    ) -> None:
        self.group: CallCgroup | None = None
        self.gate: Gate | None = None
        self._closed = False
        self._memory_exceeded = False
        seccomp_fd = os.memfd_create("rlctl-seccomp", 0)  # bwrap reads the program from it
        try:
            os.write(seccomp_fd, sandbox.seccomp)
            os.lseek(seccomp_fd, 0, os.SEEK_SET)
            cgroups = quota.memory if quota is not None and quota.memory is not None else sandbox.cgroup
            if cgroups is not None:
                self.group = cgroups.make(sandbox.limits.memory_bytes)
            if network is not None and network.destinations:
                self.gate = Gate(network, sandbox.drop_to_uid)
            self.process = subprocess.Popen(
                sandbox.argv(
                    workdir, command, seccomp_fd, self.gate, self.group, disk, tuple(quota.join if quota else ())
                ),
                env={},  # bwrap needs nothing; the command's environment is set with --setenv
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(seccomp_fd,),
            )
        except BaseException:
            self._release()
            raise
        finally:
            os.close(seccomp_fd)

    @property
    def memory_exceeded(self) -> bool:
        """Whether the kernel ended a process of the call for reaching its memory limit (cgroup modes)."""
        if self._closed:
            return self._memory_exceeded
        return self.group is not None and self.group.oom_killed()

    @property
    def network_refused(self) -> list[str]:
        return list(self.gate.refused) if self.gate else []

    def close(self) -> None:
        """Ends every process of the call (its group; the PID namespace takes the rest) and what served it."""
        if self._closed:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._memory_exceeded = self.group is not None and self.group.oom_killed()  # read before it is removed
        self._closed = True
        self._release()

    def _release(self) -> None:
        if self.gate is not None:
            self.gate.close()
        if self.group is not None:
            self.group.remove()

    def __enter__(self) -> SandboxCall:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


class SandboxItem:
    """One item's sandbox, kept from its first call to its end: a work directory that is a tmpfs of its own
    (itemdisk.py: bytes and inodes capped by the kernel while every call runs) where the service is root, else an
    ordinary directory whose files are counted after each call (`disk_mode`: `tmpfs` or `scan`); each call is a
    fresh sandbox (SandboxCall) in it. Closing it ends the tmpfs (its files go with it) and removes `root`."""

    def __init__(self, sandbox: Sandbox, root: Path, quota: ItemQuota | None = None) -> None:
        self.sandbox = sandbox
        self.quota = quota  # the item's cgroups (its memory, its collection's CPU quota); None: per call only
        self.root = root  # where calls bind /work from (inside the keeper's namespace, when there is one)
        limits = sandbox.limits
        found = start_item_disk(root, limits.disk_bytes, limits.disk_inodes, sandbox.drop_to_uid)
        self.disk = found if isinstance(found, ItemDisk) else None
        self.disk_refusal = found if isinstance(found, str) else None  # why the directory is counted instead
        if self.disk is None:
            sandbox.prepare(root)
        self.workdir = WorkDir(root, limits.disk_bytes, sandbox.drop_to_uid, self.disk)

    @property
    def disk_mode(self) -> str:
        return "tmpfs" if self.disk is not None else "scan"

    def start(self, command: str, network: NetworkPolicy | None = None) -> SandboxCall:
        return self.sandbox.start(self.root, command, network, self.disk, self.quota)

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()
            self.disk = None
        if self.quota is not None:
            self.quota.close()  # after the tmpfs: its pages were charged to the item's cgroup
        remove_tree(self.root)

    def __enter__(self) -> SandboxItem:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


_probed: dict[tuple[str, int | None], Sandbox | str] = {}
_probe_lock = threading.Lock()


def find_sandbox(bwrap: str, sandbox_uid: int) -> Sandbox | str:
    """The sandbox, or why none can be made here; probed once (a real command in a real sandbox) and remembered."""
    path = shutil.which(bwrap)
    if path is None:
        return f"the sandbox program {bwrap!r} is not installed (Debian package: bubblewrap)"
    arch = native_arch()
    if arch is None:
        return "no seccomp filter is written for this machine's architecture (x86_64 and aarch64 are)"
    drop = sandbox_uid if os.geteuid() == 0 else None
    key = (path, drop)
    with _probe_lock:
        if key not in _probed:
            _probed[key] = _probe(Sandbox(path, drop, cgroup=find_cgroup_root(), seccomp=build_filter(arch)))
        return _probed[key]


def require_sandbox(bwrap: str, sandbox_uid: int, network: bool = False) -> Sandbox:
    """The sandbox (see find_sandbox), able to have a network if `network`; raises SandboxUnavailable (the reason
    none can be made) or NetworkUnavailable."""
    found = find_sandbox(bwrap, sandbox_uid)
    if isinstance(found, str):
        raise SandboxUnavailable(found)
    if network and relay_python() is None:
        raise NetworkUnavailable("the sandbox's network needs a Python interpreter under /usr and there is none")
    return found


def _probe(sandbox: Sandbox) -> Sandbox | str:
    with tempfile.TemporaryDirectory(prefix="rlctl-sandbox-probe-") as scratch:
        workdir = Path(scratch)
        sandbox.prepare(workdir)
        try:
            with sandbox.start(workdir, "echo probe > probe.txt") as call:
                assert call.process.stdout is not None
                try:
                    call.process.wait(timeout=PROBE_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    return "a test command in the sandbox did not end in time"
                output = call.process.stdout.read().decode("utf-8", "replace").strip()[-500:]
                returncode = call.process.returncode
        except OSError as error:
            return f"{type(error).__name__}: {error}"
        if returncode != 0 or not (workdir / "probe.txt").is_file():
            return f"a test command in the sandbox failed (exit {returncode}): {output}"
    return sandbox
