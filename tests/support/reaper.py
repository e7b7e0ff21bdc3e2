"""Tests clean up after themselves: every process a run of theirs started is stopped, even on failure."""

from __future__ import annotations

from pathlib import Path

import psutil
from sqlalchemy import select

from rlctl.service.db.engine import Database
from rlctl.service.db.models import RunProcess
from rlctl.supervisor.process import Liveness, ProcessIdentity, SupervisedProcess, identity_liveness


def stop_run_processes(database_url: str) -> list[int]:
    """Stop (group, SIGTERM then SIGKILL) every recorded run process that is still the one started."""
    db = Database(database_url)
    try:
        with db.session() as session:
            rows = session.scalars(select(RunProcess)).all()
            identities = [
                (r.role, ProcessIdentity(r.pid, r.pgid or r.pid, r.start_time)) for r in rows if r.pid and r.start_time
            ]
    except Exception:  # noqa: BLE001 - a database that was never migrated has no processes
        return []
    finally:
        db.dispose()
    stopped = []
    for role, identity in identities:
        if identity_liveness(identity) is Liveness.ALIVE:
            SupervisedProcess.adopt(role, identity, Path("/dev/null")).terminate(grace_s=5)
            stopped.append(identity.pid)
    return stopped


def process_alive(pid: int) -> bool:
    """A live process (a zombie waiting to be reaped counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def processes_named(marker: str) -> list[int]:
    """Pids of the processes whose command line contains `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
