"""When a process started: beside its pid, what recognises it, also after a restart of the service.

Counted from the machine's boot, as the kernel keeps it (`/proc/PID/stat`, field 22), never by the wall clock.
psutil's `create_time` is the boot time plus this by the wall clock, and the boot time it reads moves whenever the
clock is set (a time sync, a virtual machine resumed): a process recorded before such a step would no longer be
recognised after it, and its supervisor would neither signal it nor see it run.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# A recorded start time this large is a time since the epoch (an earlier version recorded psutil's create_time):
# a process does not start 31 years after a boot.
EPOCH_START_FLOOR = 1e9


def start_time_of(pid: int) -> float:
    """Seconds from the boot to the start of process `pid`; psutil.NoSuchProcess when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        raise psutil.NoSuchProcess(pid) from None
    fields = stat[stat.rindex(b")") + 2 :].split()  # after the command name, which may hold spaces
    return int(fields[19]) / CLOCK_TICKS  # field 22 of proc(5), the state being field 3


def started_at(pid: int, recorded: float, tolerance_s: float) -> bool:
    """Is process `pid` the one recorded as started at `recorded` (this module's time, or an earlier version's)?"""
    if recorded >= EPOCH_START_FLOOR:
        return abs(psutil.Process(pid).create_time() - recorded) <= tolerance_s
    return abs(start_time_of(pid) - recorded) <= tolerance_s
