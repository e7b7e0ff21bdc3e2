"""Limits that hold for a whole item, a whole collection and the whole host, above the per-call ones.

A call's memory cgroup (memcap.py) bounds one call; four items at 900 MB each still held 3.6 GB together, and a
collection's concurrency set how many ran. So:

- `ItemSlots`: at most `RLCTL_SANDBOX_MAX_ITEMS` items with a sandbox run at once in the service, whatever the
  collections and their concurrency (an item waits for a slot before its first call);
- nested memory cgroups: every sandboxed process is in `<service>/rlctl-sandboxes-<pid>` (limit
  `RLCTL_SANDBOX_MEMORY_BUDGET_BYTES`: all sandboxes together), then its collection's (the same budget at most),
  its item's (the per-call limit: all of an item's calls and its tmpfs work directory together), then its call's;
  the kernel's out-of-memory killer ends a process of the cgroup whose limit is reached, so one collection or one
  item cannot take memory from the others beyond the budget;
- a CPU quota per collection: `RLCTL_SANDBOX_COLLECTION_CPUS` cores (CFS bandwidth: `cpu.cfs_quota_us` on cgroup
  v1, `cpu.max` on v2) for all its calls together.

Where no memory cgroup can be made (memcap.py finds none: the `rlimit` mode), only the item slots and the
per-call rlimits apply; where no CPU cgroup can be made, there is no CPU quota. `CollectionQuota.missing` says
what is missing and why, for the log and the docs (docs/SECURITY.md#quotas).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlctl.sandbox.memcap import CallCgroup, CgroupRoot, _mounted

CPU_PERIOD_US = 100_000
_SLOT_POLL_S = 0.2


def host_memory_bytes() -> int:
    """The host's memory (MemTotal), 8 GiB where it cannot be read."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 8 << 30


def memory_budget(setting: int) -> int:
    """RLCTL_SANDBOX_MEMORY_BUDGET_BYTES, where 0 means half of the host's memory."""
    return setting if setting > 0 else host_memory_bytes() // 2


def collection_cpus(setting: float) -> float:
    """RLCTL_SANDBOX_COLLECTION_CPUS, where 0 means half of the host's cores, at least one."""
    return setting if setting > 0 else max(1.0, (os.cpu_count() or 2) / 2)


class ItemSlots:
    """A counting gate on items that run at once; `acquire` waits for a slot, giving up when `should_stop`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Condition()
        self.running = 0
        self.peak = 0  # the most that ran at once (for tests and figures)

    def acquire(self, should_stop: Callable[[], bool] = lambda: False) -> bool:
        with self._lock:
            while self.running >= self.limit:
                if should_stop():
                    return False
                self._lock.wait(timeout=_SLOT_POLL_S)  # wakes on release; the timeout rechecks should_stop
            self.running += 1
            self.peak = max(self.peak, self.running)
            return True

    def release(self) -> None:
        with self._lock:
            self.running -= 1
            self._lock.notify()


_slots: dict[int, ItemSlots] = {}
_slots_lock = threading.Lock()


def item_slots(limit: int) -> ItemSlots:
    """The service's gate for `limit` (one per value: every collection of the service shares it)."""
    with _slots_lock:
        return _slots.setdefault(limit, ItemSlots(limit))


@dataclass
class ItemQuota:
    """Where an item's calls make their memory cgroups (`memory`), and the CPU cgroups they join (`join`)."""

    memory: CgroupRoot | None
    join: list[Path] = field(default_factory=list)  # cgroup.procs files every call's first process enters
    _group: CallCgroup | None = None

    def close(self) -> None:
        if self._group is not None:
            self._group.remove()


class CollectionQuota:
    """A collection's cgroups: memory under the service's sandbox budget, and its CPU quota."""

    def __init__(self, memory_root: CgroupRoot | None, budget_bytes: int, item_bytes: int, cpus: float) -> None:
        self.item_bytes = item_bytes
        self.missing: list[str] = []  # what does not apply here, and why
        self.memory: CallCgroup | None = None
        self.cpu: CallCgroup | None = None
        name = f"rlctl-collection-{uuid.uuid4().hex[:12]}"
        if memory_root is None:
            self.missing.append("memory budget (no memory cgroup can be made here: the rlimit mode)")
        else:
            try:
                budget = _ensure(memory_root, budget_bytes)
                self.memory = _child(budget, name, budget_bytes)
            except OSError as error:
                self.missing.append(f"memory budget ({error.strerror or error})")
        cpu_root = _cpu_root(memory_root)
        if cpu_root is None:
            self.missing.append("CPU quota (no CPU cgroup can be made here)")
        elif cpu_root.kind == "cgroup2":  # one hierarchy: the collection's memory cgroup takes the quota too
            try:
                if self.memory is None:
                    raise OSError("the collection has no cgroup of its own")
                self._set_cpu(self.memory, cpus)
                self.cpu = self.memory
            except OSError as error:
                self.missing.append(f"CPU quota ({error.strerror or error})")
        else:
            try:
                self.cpu = _child(cpu_root, name, None)
                self._set_cpu(self.cpu, cpus)
            except OSError as error:
                self.missing.append(f"CPU quota ({error.strerror or error})")
                if self.cpu is not None:
                    self.cpu.remove()
                self.cpu = None

    def _set_cpu(self, group: CallCgroup, cpus: float) -> None:
        quota = max(1000, int(cpus * CPU_PERIOD_US))
        if group.kind == "cgroup2":
            (group.path / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
        else:
            (group.path / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (group.path / "cpu.cfs_quota_us").write_text(str(quota))

    def item(self) -> ItemQuota:
        """An item's memory cgroup (all its calls together at `item_bytes`), inside the collection's."""
        join = [self.cpu.procs] if self.cpu is not None and self.cpu is not self.memory else []
        if self.memory is None:
            return ItemQuota(None, join)
        root = CgroupRoot(self.memory.kind, self.memory.path)
        try:
            group = _child(root, f"rlctl-item-{uuid.uuid4().hex[:12]}", self.item_bytes)
        except OSError:
            return ItemQuota(root, join)  # the calls still go under the collection's budget
        return ItemQuota(CgroupRoot(group.kind, group.path), join, group)

    def close(self) -> None:
        """Removes the collection's cgroups (what is left in them is killed first)."""
        for group in (self.memory, self.cpu):
            if group is not None:
                for child in _children(group.path):
                    CallCgroup(group.kind, child).remove()
                group.remove()


def _children(path: Path) -> list[Path]:
    with contextlib.suppress(OSError):
        return [entry for entry in path.iterdir() if entry.is_dir()]
    return []


def _limit(group: CallCgroup, limit_bytes: int) -> None:
    if group.kind == "cgroup2":
        (group.path / "memory.max").write_text(str(limit_bytes))
    else:
        (group.path / "memory.limit_in_bytes").write_text(str(limit_bytes))


def _delegate(group: CallCgroup, controllers: tuple[str, ...]) -> None:
    """cgroup v2: the controllers its children get (v1 hierarchies are one controller each, always nested)."""
    if group.kind == "cgroup2":
        for controller in controllers:
            with contextlib.suppress(OSError):
                (group.path / "cgroup.subtree_control").write_text(f"+{controller}")


def _ensure(root: CgroupRoot, limit_bytes: int) -> CgroupRoot:
    """The service's cgroup of all its sandboxes, at the budget: one per service process (named by its pid, so
    two services, or test processes, never share one), made once and kept; those of ended processes, empty,
    are removed."""
    path = root.path / f"rlctl-sandboxes-{os.getpid()}"
    if not path.is_dir():
        for stale in root.path.glob("rlctl-sandboxes-*"):
            pid = stale.name.rpartition("-")[2]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                with contextlib.suppress(OSError):
                    stale.rmdir()
    path.mkdir(exist_ok=True)
    group = CallCgroup(root.kind, path)
    _limit(group, limit_bytes)
    _delegate(group, ("memory", "cpu"))
    return CgroupRoot(root.kind, path)


def _child(root: CgroupRoot, name: str, limit_bytes: int | None) -> CallCgroup:
    path = root.path / name
    path.mkdir()
    group = CallCgroup(root.kind, path)
    try:
        if limit_bytes is not None:
            _limit(group, limit_bytes)
        _delegate(group, ("memory", "cpu"))
    except OSError:
        group.remove()
        raise
    return group


def _cpu_root(memory_root: CgroupRoot | None) -> CgroupRoot | None:
    """Where CPU cgroups are made: the memory root itself on cgroup v2 (where `cpu` is delegated), else the
    service's cgroup of a v1 `cpu` hierarchy, checked by making one."""
    if memory_root is not None and memory_root.kind == "cgroup2":
        with contextlib.suppress(OSError):
            if "cpu" in (memory_root.path / "cgroup.subtree_control").read_text().split():
                return memory_root
        return None
    try:
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for membership in memberships:
        hierarchy, controllers, path = (membership.split(":", 2) + ["", ""])[:3]
        if hierarchy != "0" and "cpu" in controllers.split(","):
            for base in _mounted(mounts, "cgroup", "cpu", path):
                if (base / "cpu.cfs_quota_us").exists() and os.access(base, os.W_OK):
                    return CgroupRoot("cgroup1", base)
    return None


def throttled_periods(group: CallCgroup) -> int:
    """How many CFS periods the cgroup was held back by its quota (cpu.stat)."""
    with contextlib.suppress(OSError):
        match = re.search(r"^nr_throttled (\d+)$", (group.path / "cpu.stat").read_text(), re.MULTILINE)
        return int(match.group(1)) if match else 0
    return 0
