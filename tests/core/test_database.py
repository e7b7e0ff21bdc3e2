"""Migrations and the schema on SQLite and PostgreSQL; /readyz follows the schema revision."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Integer, String, bindparam, func, inspect, literal, select, text
from sqlalchemy.dialects.postgresql import psycopg as postgresql_psycopg
from sqlalchemy.exc import IntegrityError

from rlctl.service.db import migrate
from rlctl.service.db.engine import Database
from rlctl.service.db.loop_reads import LoopReads
from rlctl.service.db.models import Run, RunProcess
from rlctl.service.db.plans import Read, ReadPlan
from rlctl.service.errors import Unavailable
from rlctl.service.settings import Settings
from rlctl.supervisor.ports import free_ports
from tests.support.databases import database_kinds, fresh_database
from tests.support.live import in_process_service
from tests.support.waiting import wait_until

TABLES = {"runs", "run_processes", "run_metrics", "status_checks", "tool_sessions", "jobs", "alembic_version"}


@pytest.fixture(params=database_kinds())
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """These tests are of the migrations: their databases start empty, not from the migrated template."""
    with fresh_database(request.param, tmp_path) as url:
        yield url


@pytest.fixture
def db(database_url: str) -> Database:
    database = Database(database_url)
    yield database
    database.dispose()


def test_upgrade_creates_the_schema_and_downgrade_removes_it(db: Database) -> None:
    migrate.upgrade(db)
    assert set(inspect(db.engine).get_table_names()) >= TABLES
    assert migrate.is_schema_current(db)
    migrate.upgrade(db)  # idempotent
    migrate.downgrade(db, "base")
    assert set(inspect(db.engine).get_table_names()) <= {"alembic_version"}
    assert not migrate.is_schema_current(db)


def test_sqlite_runs_in_wal_mode_with_foreign_keys(tmp_path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'x.db'}")
    with database.engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1
    database.dispose()


def test_timestamps_come_back_in_utc_and_foreign_keys_hold(db: Database) -> None:
    migrate.upgrade(db)
    created = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=7)))
    with db.session() as session:
        session.add(Run(id="r1", environment="echo", backend="local", status="pending", created_at=created))
    with db.session() as session:
        run = session.scalars(select(Run)).one()
        assert run.created_at == created
        assert run.created_at.tzinfo is not None and run.created_at.utcoffset() == timedelta(0)
    with pytest.raises(IntegrityError), db.session() as session:
        session.add(RunProcess(run_id="missing", role="api", status="pending"))


def test_idempotency_keys_are_unique(db: Database) -> None:
    migrate.upgrade(db)
    with db.session() as session:
        session.add(Run(id="a", environment="e", backend="local", status="pending", idempotency_key="k"))
    with pytest.raises(IntegrityError), db.session() as session:
        session.add(Run(id="b", environment="e", backend="local", status="pending", idempotency_key="k"))


def test_readyz_fails_while_the_schema_is_behind(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings()
    with in_process_service(settings) as live, live.client() as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["schema_revision"] == migrate.head_revision()
        migrate.downgrade(live.app.state.context.db, "base")
        # the check runs in the background: the next one sees the schema behind (docs/ARCHITECTURE.md#performance)
        behind = wait_until(lambda: _answered(client.get("/readyz"), 503), timeout=10, message="/readyz says behind")
        assert behind.json()["error"]["code"] == "UNAVAILABLE"
        assert behind.json()["error"]["details"]["schema_revision"] is None
        assert client.get("/healthz").status_code == 200
        migrate.upgrade(live.app.state.context.db)
        wait_until(lambda: _answered(client.get("/readyz"), 200), timeout=10, message="/readyz says ready again")


def _answered(response: httpx.Response, status: int) -> httpx.Response | None:
    return response if response.status_code == status else None


def test_start_up_applies_migrations(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings()
    with in_process_service(settings) as live:
        assert migrate.is_schema_current(live.app.state.context.db)


def test_migrations_and_models_agree(db: Database) -> None:
    """Autogenerate finds nothing to do: every model change came with its migration."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from rlctl.service.db.models import Base

    migrate.upgrade(db)
    with db.engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []


def _counting_plan(threads: list[int]) -> ReadPlan[list[int]]:
    """Two statements, the second bound to the first's answer; notes the thread each step runs on."""
    threads.append(threading.get_ident())
    first = yield Read(select(literal(20).label("n")))
    threads.append(threading.get_ident())
    second = yield Read(select((bindparam("n", type_=Integer) + 1).label("n")), {"n": first[0].n})
    threads.append(threading.get_ident())
    return [first[0].n, second[0].n]


def _on_the_loop(db: Database, plan: Callable[..., ReadPlan[Any]], *args: Any) -> Any:
    async def read() -> Any:
        await db.open_loop_reads()
        try:
            return await db.loop_read(plan, *args), threading.get_ident()
        finally:
            await db.close_loop_reads()

    return asyncio.run(read())


def test_a_read_plan_gives_the_same_in_a_thread_and_on_the_event_loop(db: Database) -> None:
    in_thread: list[int] = []
    assert db.run_plan(_counting_plan(in_thread)) == [20, 21]
    on_loop: list[int] = []
    result, loop_thread = _on_the_loop(db, _counting_plan, on_loop)
    assert result == [20, 21]
    assert on_loop == [loop_thread] * 3  # no step went to a worker thread, on either engine


@pytest.mark.skipif("postgresql" not in database_kinds(), reason="PostgreSQL is not configured")
def test_a_slow_postgresql_read_does_not_hold_up_the_event_loop(tmp_path: Path) -> None:
    def sleeping_plan() -> ReadPlan[str]:
        rows = yield Read(select(func.pg_sleep(0.3).cast(String).label("slept")))
        return rows[0].slept

    async def scenario(db: Database) -> tuple[bool, str]:
        await db.open_loop_reads()
        try:
            read = asyncio.create_task(db.loop_read(sleeping_plan))
            await asyncio.sleep(0)  # the read begins, and gives the loop back while the server works
            loop_was_free = not read.done()
            return loop_was_free, await read
        finally:
            await db.close_loop_reads()

    with fresh_database("postgresql", tmp_path) as url:
        db = Database(url)
        try:
            assert asyncio.run(scenario(db)) == (True, "")
        finally:
            db.dispose()


@pytest.mark.skipif("postgresql" not in database_kinds(), reason="PostgreSQL is not configured")
def test_a_postgresql_read_outlives_the_server_dropping_its_connection(tmp_path: Path) -> None:
    def server_pid_plan() -> ReadPlan[int]:
        rows = yield Read(select(func.pg_backend_pid().label("pid")))
        return rows[0].pid

    async def scenario(db: Database, url: str) -> tuple[set[int], int]:
        await db.open_loop_reads()
        try:
            await db.loop_read(server_pid_plan)
            # What a server restart does to the pooled connections: their server processes end (each waited for,
            # 5 s). Every one of them, so the next read cannot be handed a sound one.
            admin = Database(url)
            with admin.engine.connect() as connection:
                pooled = text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                ended_pids = set(connection.execute(pooled).scalars())
                for pid in ended_pids:
                    connection.execute(select(func.pg_terminate_backend(pid, 5000)))
            admin.dispose()
            return ended_pids, await db.loop_read(server_pid_plan)
        finally:
            await db.close_loop_reads()

    with fresh_database("postgresql", tmp_path) as url:
        db = Database(url)
        try:
            ended, after = asyncio.run(scenario(db, url))
        finally:
            db.dispose()
    assert ended and after not in ended  # read again on a new connection, not failed


def test_a_postgresql_read_with_no_server_to_reach_answers_unavailable() -> None:
    def plan() -> ReadPlan[int]:
        rows = yield Read(select(literal(1).label("n")))
        return rows[0].n

    nothing_listens = f"postgresql+psycopg://postgres@127.0.0.1:{free_ports(1)[0]}/test"
    reads = LoopReads(nothing_listens, postgresql_psycopg.dialect(), size=1, wait_s=0.5)

    async def scenario() -> None:
        await reads.open()
        try:
            with pytest.raises(Unavailable) as refused:
                await reads.run(plan)
            assert refused.value.status_code == 503 and refused.value.code == "UNAVAILABLE"
        finally:
            await reads.close()

    asyncio.run(scenario())


@pytest.mark.skipif("postgresql" not in database_kinds(), reason="PostgreSQL is not configured")
def test_identical_postgresql_reads_share_a_statement_begun_after_they_asked(tmp_path: Path) -> None:
    """Callers of one key that ask while its statement is under way share the next one, which sees what was
    committed before they asked: a client reads its own write (rlctl/service/db/shared_reads.py)."""
    statements: list[str] = []
    held = 4242  # an advisory lock the test holds: the first statement waits on it, its snapshot already taken

    def counting_plan(label: str) -> ReadPlan[int]:
        statements.append(label)
        wait = func.pg_advisory_xact_lock_shared(held).cast(String).label("waited")
        count = select(func.count()).select_from(Run).scalar_subquery().label("runs")
        rows = yield Read(select(wait, count))
        return rows[0].runs

    def waiting_on_the_lock(url: str) -> bool:
        with Database(url).engine.connect() as connection:
            query = text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
            return bool(connection.execute(query).scalar())

    async def scenario(db: Database, url: str) -> list[int]:
        await db.open_loop_reads()
        holder = Database(url)
        try:
            with holder.engine.connect() as lock:
                lock.execute(select(func.pg_advisory_lock(held)))
                first = asyncio.create_task(db.shared_read("runs", counting_plan, "first"))
                await asyncio.to_thread(wait_until, lambda: waiting_on_the_lock(url), 60, message="the first read")
                with db.session() as session:
                    session.add(Run(id="late", environment="echo", backend="local", status="queued", config={}))
                later = [asyncio.create_task(db.shared_read("runs", counting_plan, f"later {n}")) for n in range(4)]
                await asyncio.sleep(0)  # they ask while the first is under way
                lock.execute(select(func.pg_advisory_unlock(held)))
                lock.commit()
            return [await first, *await asyncio.gather(*later)]
        finally:
            holder.dispose()
            await db.close_loop_reads()

    with fresh_database("postgresql", tmp_path) as url:
        migrate.upgrade(Database(url))
        db = Database(url)
        try:
            answers = asyncio.run(scenario(db, url))
        finally:
            db.dispose()
    assert answers == [0, 1, 1, 1, 1]  # the later callers see the run committed before they asked
    assert statements == ["first", "later 0"]  # and share one statement
