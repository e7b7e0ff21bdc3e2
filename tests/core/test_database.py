"""Migrations and the schema on SQLite and PostgreSQL; /readyz follows the schema revision."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import inspect, select, text
from sqlalchemy.exc import IntegrityError

from service.db import migrate
from service.db.engine import Database
from service.db.models import Run, RunProcess
from service.settings import Settings
from tests.support.databases import database_kinds, fresh_database
from tests.support.live import in_process_service

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
        behind = client.get("/readyz")
        assert behind.status_code == 503
        assert behind.json()["error"]["code"] == "UNAVAILABLE"
        assert client.get("/healthz").status_code == 200
        migrate.upgrade(live.app.state.context.db)
        assert client.get("/readyz").status_code == 200


def test_start_up_applies_migrations(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings()
    with in_process_service(settings) as live:
        assert migrate.is_schema_current(live.app.state.context.db)


def test_migrations_and_models_agree(db: Database) -> None:
    """Autogenerate finds nothing to do: every model change came with its migration."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from service.db.models import Base

    migrate.upgrade(db)
    with db.engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
