"""The disk of one item (one trajectory's work directory): a tmpfs of its own, capped in bytes and in inodes by the
kernel, while every call runs and whatever paths a command makes.

Counting the files of a directory after a call let a command hold more than the limit while it ran, and paths
longer than the OS limit (deep directories) went uncounted; nothing capped the number of files. A tmpfs mounted
with `size=` and `nr_inodes=` makes the kernel refuse the write (ENOSPC) that would go over either.

Mounting needs CAP_SYS_ADMIN, and a mount in the service's own namespace would outlive a crashed service. So the
tmpfs lives in a mount namespace of its own, held by a keeper process (`unshare --mount`, `mount`, then a `cat`
reading the service's pipe): the host never sees the mount, and when the keeper ends (closed, killed, or its pipe
closed by the service's death) the namespace, and the tmpfs with its memory, go with it. A call joins that
namespace (`nsenter --mount`) before the sandbox starts, so the sandbox binds the tmpfs as `/work`; the service's
file tools reach it through `/proc/<keeper>/root`, the keeper's view of the file tree.

Where the keeper cannot be made (the service is not root), `start_item_disk` returns the reason and the work
directory is an ordinary directory whose files are counted after each call (docs/SECURITY.md#disk).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

MAX_INODES = 16_384  # files and directories an item may hold
_START_TIMEOUT_S = 10.0
_KEEPER = 'mount -t tmpfs -o "$1" rlctl-item "$0" && echo ready && exec cat >/dev/null'


@dataclass(frozen=True)
class DiskUse:
    used_bytes: int
    used_inodes: int


class ItemDisk:
    """A running keeper and its tmpfs, mounted at `mount_point` in the keeper's namespace."""

    def __init__(self, process: subprocess.Popen[bytes], mount_point: Path) -> None:
        self.process = process
        self.mount_point = mount_point

    @property
    def path(self) -> Path:
        """Where the service sees the tmpfs: through the keeper's root (never resolve it: that leaves the view)."""
        return Path(f"/proc/{self.process.pid}/root{self.mount_point}")

    def enter(self) -> list[str]:
        """The prefix that runs a command in the keeper's mount namespace."""
        return [_nsenter(), f"--target={self.process.pid}", "--mount", "--"]

    def usage(self) -> DiskUse:
        stats = os.statvfs(self.path)
        return DiskUse((stats.f_blocks - stats.f_bfree) * stats.f_frsize, stats.f_files - stats.f_ffree)

    def close(self) -> None:
        """Ends the keeper: the namespace and the tmpfs (its memory) go once the last call in it has ended."""
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


def start_item_disk(mount_point: Path, size_bytes: int, inodes: int, owner_uid: int | None) -> ItemDisk | str:
    """A tmpfs of `size_bytes` and `inodes` at `mount_point` (an existing empty directory) in a keeper's mount
    namespace, owned by `owner_uid` (the sandbox's user); or why none can be made here."""
    if os.geteuid() != 0:
        return "an item's tmpfs needs the service to run as root (CAP_SYS_ADMIN to mount)"
    unshare, nsenter = shutil.which("unshare", path="/usr/bin:/bin"), _nsenter()
    if unshare is None or not Path(nsenter).exists():
        return "unshare and nsenter (Debian package util-linux) are not installed"
    owner = owner_uid if owner_uid is not None else os.geteuid()
    options = f"size={size_bytes},nr_inodes={inodes},mode=0755,uid={owner},gid={owner},nosuid,nodev"
    process = subprocess.Popen(
        [unshare, "--mount", "--propagation=private", "--", "/bin/sh", "-c", _KEEPER, str(mount_point), options],
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    disk = ItemDisk(process, mount_point)
    assert process.stdout is not None and process.stderr is not None
    try:
        ready = process.stdout.readline()  # "ready" once mounted; EOF when unshare or mount failed
    except OSError:
        ready = b""
    if ready.strip() != b"ready":
        with contextlib.suppress(OSError):
            process.stdin.close()  # type: ignore[union-attr]
        why = process.stderr.read().decode(errors="replace").strip()[-300:]
        disk.close()
        return f"an item's tmpfs could not be mounted: {why}"
    return disk


def _nsenter() -> str:
    return shutil.which("nsenter", path="/usr/bin:/bin") or "/usr/bin/nsenter"
