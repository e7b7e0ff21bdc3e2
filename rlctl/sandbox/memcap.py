"""The memory cap of a sandboxed call: a cgroup of its own where the service may make one, else only rlimits.

An address-space rlimit (`prlimit --as`) is per process and counts reservations, not memory: forty processes of
2 GiB, or a tmpfs filled from `/tmp`, pass it. A memory cgroup caps what the whole call really uses (its
processes' pages, and the tmpfs pages they write), and the kernel's out-of-memory killer ends a process of that
call only when it is reached. Which one applies is found once, by making a test cgroup:

- `cgroup2`: the service's own cgroup of the unified hierarchy, where `memory` is delegated to its children
  (`memory` in its `cgroup.subtree_control`); each call gets a child with `memory.max` and `memory.swap.max`.
- `cgroup1`: the service's cgroup of a v1 `memory` hierarchy, where it may make children (as root in a
  container or VM whose cgroups are v1); each call gets a child with `memory.limit_in_bytes` (and
  `memory.memsw.limit_in_bytes`, so swap does not extend it).
- `rlimit`: neither: only the per-process address-space limit applies.

A call's first process (a `/bin/sh` that execs the sandbox) writes its own pid into the call's `cgroup.procs`
before anything of the sandbox starts, so every process of the call is in it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

_REMOVE_DEADLINE_S = 5.0


@dataclass(frozen=True)
class CgroupRoot:
    """Where call cgroups are made."""

    kind: str  # "cgroup2" or "cgroup1"
    path: Path

    def make(self, limit_bytes: int) -> CallCgroup:
        path = self.path / f"rlctl-call-{uuid.uuid4().hex[:12]}"
        path.mkdir()
        group = CallCgroup(self.kind, path)
        try:
            if self.kind == "cgroup2":
                (path / "memory.max").write_text(str(limit_bytes))
                with contextlib.suppress(OSError):  # absent where swap accounting is off
                    (path / "memory.swap.max").write_text("0")
            else:
                (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
                with contextlib.suppress(OSError):
                    (path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        except OSError:
            group.remove()
            raise
        return group


@dataclass(frozen=True)
class CallCgroup:
    kind: str
    path: Path

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the call for reaching the limit."""
        try:
            if self.kind == "cgroup2":
                counters = (self.path / "memory.events").read_text()
            else:
                counters = (self.path / "memory.oom_control").read_text()
        except OSError:
            return False
        for line in counters.splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill" and value.strip().isdigit():
                return int(value) > 0
        if self.kind == "cgroup1":  # kernels before 4.13 have no oom_kill counter: the limit was reached
            with contextlib.suppress(OSError, ValueError):
                return int((self.path / "memory.failcnt").read_text()) > 0
        return False

    def remove(self) -> None:
        """Kills what is left of the call in the cgroup and removes it (a cgroup is removed once empty)."""
        deadline = time.monotonic() + _REMOVE_DEADLINE_S
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return  # left behind, empty of anything that runs; named rlctl-call-* for an operator
            if self.kind == "cgroup2" and (self.path / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (self.path / "cgroup.kill").write_text("1")
            else:
                with contextlib.suppress(OSError):
                    for pid in self.procs.read_text().split():
                        with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                            os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.02)  # the killed processes are being reaped by the kernel


def find_cgroup_root() -> CgroupRoot | None:
    """Where this process may make memory cgroups, checked by making one; None where it may not."""
    for root in _candidates():
        try:
            root.make(64 << 20).remove()
        except OSError:
            continue
        return root
    return None


def _candidates() -> list[CgroupRoot]:
    try:
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    found: list[CgroupRoot] = []
    for membership in memberships:
        hierarchy, controllers, path = (membership.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and controllers == "":
            for base in _mounted(mounts, "cgroup2", None, path):
                with contextlib.suppress(OSError):
                    if "memory" in (base / "cgroup.subtree_control").read_text().split():
                        found.append(CgroupRoot("cgroup2", base))
        elif "memory" in controllers.split(","):
            found += [CgroupRoot("cgroup1", base) for base in _mounted(mounts, "cgroup", "memory", path)]
    return found


def _mounted(mountinfo: list[str], fstype: str, option: str | None, cgroup: str) -> list[Path]:
    """Where the cgroup `cgroup` is seen in the mounts of a file-system type (and, for cgroup v1, with the
    controller among its options): a mount shows the hierarchy from its root (field 4) down."""
    points = []
    for line in mountinfo:
        fields = line.split()
        if "-" not in fields:
            continue
        separator = fields.index("-")
        if fields[separator + 1] != fstype:
            continue
        if option is not None and option not in fields[-1].split(","):
            continue
        root = fields[3].rstrip("/")
        if cgroup == root or cgroup.startswith(root + "/"):
            points.append(Path(fields[4]) / cgroup[len(root) :].lstrip("/"))
    return points
