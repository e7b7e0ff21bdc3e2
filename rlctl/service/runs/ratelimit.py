"""The live status check limit: once per interval per run, decided by the database (across restarts and
replicas). Exactly one of several concurrent checks wins: the row update is a compare-and-set on the
time of the last allowed check, and the first check of a run is an insert that only one can make.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rlctl.service.db.models import StatusCheck
from rlctl.service.db.rows import changed_rows


@dataclass(frozen=True)
class Allowance:
    allowed: bool
    checked_at: datetime  # the last allowed check (now, when allowed)
    retry_after_s: float
    last_snapshot: dict[str, Any] | None


def acquire(session: Session, run_id: str, now: datetime, interval_s: float) -> Allowance:
    threshold = now - timedelta(seconds=interval_s)
    won = changed_rows(
        session,
        update(StatusCheck)
        .where(StatusCheck.run_id == run_id, StatusCheck.checked_at <= threshold)
        .values(checked_at=now, checks_allowed=StatusCheck.checks_allowed + 1),
    )
    if won == 1:
        return Allowance(True, now, 0.0, None)
    if session.get(StatusCheck, run_id) is None and _insert_first_check(session, run_id, now):
        return Allowance(True, now, 0.0, None)
    session.execute(
        update(StatusCheck).where(StatusCheck.run_id == run_id).values(checks_limited=StatusCheck.checks_limited + 1)
    )
    row = session.get(StatusCheck, run_id, populate_existing=True)
    assert row is not None
    retry_after = max(0.0, interval_s - (now - row.checked_at).total_seconds())
    return Allowance(False, row.checked_at, retry_after, row.snapshot or None)


def store_snapshot(session: Session, run_id: str, checked_at: datetime, snapshot: dict[str, Any]) -> None:
    """Keep the snapshot of the allowed check (unless a newer check has already been allowed)."""
    session.execute(
        update(StatusCheck)
        .where(StatusCheck.run_id == run_id, StatusCheck.checked_at == checked_at)
        .values(snapshot=snapshot)
    )


def _insert_first_check(session: Session, run_id: str, now: datetime) -> bool:
    try:
        with session.begin_nested():
            session.add(StatusCheck(run_id=run_id, checked_at=now, snapshot={}, checks_allowed=1, checks_limited=0))
    except IntegrityError:
        return False  # a concurrent first check won
    return True


def describe_interval(seconds: float) -> str:
    """The interval as agents and people read it: "30 minutes", "1 minute", "90 seconds"."""
    if seconds >= 60 and seconds % 60 == 0:
        minutes = int(seconds // 60)
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{seconds:g} second{'s' if seconds != 1 else ''}"


def status_rule(interval_s: float) -> str:
    """The rule as the agent tools state it, with the configured interval."""
    return (
        f"Live status checks are limited to one per run every {describe_interval(interval_s)}: a check sooner "
        "returns rate_limited with next_check_in_seconds, so wait that long instead of polling. A run that has "
        "ended answers its final state (live: false) at any time."
    )
