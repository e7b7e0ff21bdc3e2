"""The live status check: once per interval per run, enforced by the database on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import event, func, select

from rlctl.service.db.engine import Database
from rlctl.service.db.models import Run, StatusCheck
from rlctl.service.errors import RateLimited
from rlctl.service.runs.service import check_status
from rlctl.service.settings import Settings
from tests.support.live import in_process_service
from tests.support.waiting import wait_until


def add_run(database_url: str, run_id: str, status: str = "running", **fields: object) -> None:
    """A run record with no processes: a live check reads it like any other (a `running` one is limited)."""
    db = Database(database_url)
    with db.session() as session:
        session.add(Run(id=run_id, environment="echo", backend="local", status=status, **fields))
    db.dispose()


def set_status(database_url: str, run_id: str, status: str, **fields: object) -> None:
    db = Database(database_url)
    with db.session() as session:
        run = session.get(Run, run_id)
        run.status = status
        for name, value in fields.items():
            setattr(run, name, value)
    db.dispose()


def status_rows(database_url: str) -> int:
    db = Database(database_url)
    with db.session() as session:
        count = session.scalar(select(func.count()).select_from(StatusCheck))
    db.dispose()
    return count


def test_second_check_is_429_with_retry_after_and_the_last_snapshot(
    make_settings: Callable[..., Settings], database_url: str
) -> None:
    with in_process_service(make_settings()) as live, live.client() as client:
        add_run(database_url, "run1")
        first = client.get("/runs/run1/status")
        assert first.status_code == 200, first.text
        assert first.json()["rate_limited"] is False
        assert first.json()["next_check_in_seconds"] == 1800
        second = client.get("/runs/run1/status")
        assert second.status_code == 429
        body = second.json()
        assert body["error"]["code"] == "RATE_LIMITED"
        assert body["rate_limited"] is True and body["run_id"] == "run1"
        assert 1790 < body["next_check_in_seconds"] <= 1800
        assert 1790 < int(second.headers["Retry-After"]) <= 1800
        assert body["last_snapshot"]["run_id"] == "run1"
        assert body["last_snapshot"]["status"] == "running"
        assert body["stored"]["status"] == "running" and body["stored"]["id"] == "run1"
        # the stored record is never limited
        assert client.get("/runs/run1").status_code == 200


def test_unknown_id_is_404_and_consumes_nothing(make_settings: Callable[..., Settings], database_url: str) -> None:
    with in_process_service(make_settings()) as live, live.client() as client:
        add_run(database_url, "known")
        missing = client.get("/runs/unknown1/status")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "RUN_NOT_FOUND"
        assert status_rows(database_url) == 0
        assert client.get("/runs/known/status").status_code == 200


def test_the_limit_holds_across_a_restart(make_settings: Callable[..., Settings], database_url: str) -> None:
    settings = make_settings()
    with in_process_service(settings) as live, live.client() as client:
        add_run(database_url, "kept")
        assert client.get("/runs/kept/status").status_code == 200
    with in_process_service(settings) as live, live.client() as client:
        limited = client.get("/runs/kept/status")
        assert limited.status_code == 429
        assert limited.json()["last_snapshot"]["run_id"] == "kept"


def test_concurrent_checks_let_exactly_one_through(make_settings: Callable[..., Settings], database_url: str) -> None:
    with in_process_service(make_settings()) as live:
        add_run(database_url, "busy")

        def check(_: int) -> int:
            with live.client() as client:
                return client.get("/runs/busy/status").status_code

        with ThreadPoolExecutor(max_workers=8) as pool:
            codes = list(pool.map(check, range(8)))
    assert sorted(codes) == [200] + [429] * 7


def test_each_check_is_one_database_transaction(make_settings: Callable[..., Settings], database_url: str) -> None:
    """An allowed check, a limited one (its count stored before the 429) and an ended run's: each one transaction,
    counted as the engine begins them on this thread (the service's own work runs on others)."""
    with in_process_service(make_settings()) as live:
        add_run(database_url, "checked")
        add_run(database_url, "ended", status="completed")
        ctx = live.app.state.context
        here, begun = threading.get_ident(), []

        def count_begin(_connection: object) -> None:
            if threading.get_ident() == here:
                begun.append(1)

        event.listen(ctx.db.engine, "begin", count_begin)
        try:
            for run_id, limited in (("checked", False), ("checked", True), ("ended", False)):
                begun.clear()
                if limited:
                    with pytest.raises(RateLimited):
                        check_status(ctx, run_id)
                else:
                    check_status(ctx, run_id)
                assert len(begun) == 1, f"{run_id} (limited: {limited})"
        finally:
            event.remove(ctx.db.engine, "begin", count_begin)


def test_a_check_is_allowed_again_after_the_interval(make_settings: Callable[..., Settings], database_url: str) -> None:
    with in_process_service(make_settings(status_check_interval_s=1)) as live, live.client() as client:
        add_run(database_url, "later")
        assert client.get("/runs/later/status").status_code == 200
        assert client.get("/runs/later/status").status_code == 429
        wait_until(lambda: client.get("/runs/later/status").status_code == 200, timeout=10, message="allowed again")


def test_an_ended_run_answers_its_final_state_without_using_the_allowance(
    make_settings: Callable[..., Settings], database_url: str
) -> None:
    with in_process_service(make_settings()) as live, live.client() as client:
        add_run(database_url, "ending", last_step=3)
        assert client.get("/runs/ending/status").json()["live"] is True
        limited = client.get("/runs/ending/status")
        assert limited.status_code == 429
        failure = {"kind": "sampling_failed", "message": "trainer exited with code 1: ...", "process": "trainer"}
        set_status(database_url, "ending", "failed", last_step=5, failure=failure)
        # The 429 of a live run carries the stored record; once it has ended, so does every check, at once.
        for _ in range(3):
            final = client.get("/runs/ending/status")
            assert final.status_code == 200, final.text
            body = final.json()
            assert body["live"] is False and body["rate_limited"] is False and body["next_check_in_seconds"] == 0
            assert body["status"] == "failed" and body["last_step"] == 5
            assert body["failure"]["kind"] == "sampling_failed"
        add_run(database_url, "done", status="completed")
        assert all(client.get("/runs/done/status").status_code == 200 for _ in range(3))
    db = Database(database_url)
    with db.session() as session:
        checks = {row.run_id: row.checks_allowed for row in session.scalars(select(StatusCheck))}
    db.dispose()
    assert checks == {"ending": 1}  # only the live check used the allowance; ended runs use none


def test_the_429_of_a_live_run_carries_its_stored_state(
    make_settings: Callable[..., Settings], database_url: str
) -> None:
    with in_process_service(make_settings()) as live, live.client() as client:
        add_run(database_url, "moving", last_step=1)
        assert client.get("/runs/moving/status").status_code == 200
        set_status(database_url, "moving", "running", last_step=9)
        body = client.get("/runs/moving/status").json()
        assert body["last_snapshot"]["last_step"] == 1  # what the last allowed check saw
        assert body["stored"]["last_step"] == 9 and body["stored"]["status"] == "running"  # what is stored now
