"""Databases for tests: SQLite always, PostgreSQL when configured; migrated once per session.

Migrating costs more than most tests that need a database, so each session builds the schema once:
- SQLite: a migrated template file, copied for each test (a copy is a few milliseconds).
- PostgreSQL: one migrated database per session, handed to one test at a time and emptied before each
  (other connections to it ended, every table but the revision truncated, sequences restarted), which is as
  clean as a new database and ten times cheaper than creating one. A second PostgreSQL database in the same test
  is created and migrated as before, and dropped at its end.
Tests of the migrations themselves take an empty database (`fresh_database` without `migrated`).
"""

from __future__ import annotations

import functools
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from rlctl.service.db import migrate
from rlctl.service.db.engine import Database
from rlctl.service.settings import normalize_database_url

POSTGRES_URL_VARIABLE = "RLCTL_TEST_POSTGRES_URL"


def database_kinds() -> list[str]:
    """SQLite always; PostgreSQL when RLCTL_TEST_POSTGRES_URL is set (then it must be reachable)."""
    return ["sqlite", "postgresql"] if os.environ.get(POSTGRES_URL_VARIABLE) else ["sqlite"]


def _admin_url() -> str:
    return normalize_database_url(os.environ[POSTGRES_URL_VARIABLE])


def _postgres_url(name: str) -> str:
    return make_url(_admin_url()).set(database=name).render_as_string(hide_password=False)


def _execute(url: str, *statements: str) -> None:
    engine: Engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            for statement in statements:
                connection.execute(text(statement))
    finally:
        engine.dispose()


def _migrate(url: str) -> None:
    database = Database(url)
    try:
        migrate.upgrade(database)
    finally:
        database.dispose()


class MigratedDatabases:
    """The migrated databases of one session, each built on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._sqlite_template: Path | None = None
        self._postgres_name: str | None = None
        self._postgres_leased = False

    def sqlite_copy(self, path: Path) -> str:
        if self._sqlite_template is None:
            template = self.root / "template.db"
            _migrate(f"sqlite:///{template}")
            # A clean close checkpoints the write-ahead log into the file: the file alone is the whole database.
            leftovers = [p.name for p in self.root.glob("template.db-*")]
            assert not leftovers, f"the SQLite template kept {leftovers}"
            self._sqlite_template = template
        shutil.copyfile(self._sqlite_template, path)
        return f"sqlite:///{path}"

    @contextmanager
    def postgres(self) -> Iterator[str]:
        if self._postgres_leased:  # already this test's: a second one of its own
            with _new_postgres(migrated=True) as url:
                yield url
            return
        if self._postgres_name is None:
            self._postgres_name = f"rlctl_test_{uuid.uuid4().hex[:12]}"
            _execute(_admin_url(), f'CREATE DATABASE "{self._postgres_name}"')
        url = _postgres_url(self._postgres_name)
        self._postgres_leased = True
        try:
            _empty(url)
            yield url
        finally:
            self._postgres_leased = False

    def drop(self) -> None:
        if self._postgres_name is not None:
            _execute(_admin_url(), f'DROP DATABASE IF EXISTS "{self._postgres_name}" WITH (FORCE)')
            self._postgres_name = None


@functools.cache
def _head_revision() -> str | None:
    return migrate.head_revision()


def _empty(url: str) -> None:
    """The session's PostgreSQL database as a new migrated one: no one else connected, no rows, fresh sequences."""
    _execute(
        url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    database = Database(url)
    try:
        if migrate.current_revision(database) != _head_revision():
            migrate.upgrade(database)  # a first use, or a test moved the revision
        with database.engine.connect() as connection:
            tables = connection.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'alembic_version'")
            ).scalars()
            names = ", ".join(f'"{name}"' for name in tables)
            if names:
                connection.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
            connection.commit()
    finally:
        database.dispose()


@contextmanager
def migrated_databases(root: Path) -> Iterator[MigratedDatabases]:
    databases = MigratedDatabases(root)
    try:
        yield databases
    finally:
        databases.drop()


@contextmanager
def _new_postgres(migrated: bool) -> Iterator[str]:
    name = f"rlctl_test_{uuid.uuid4().hex[:12]}"
    _execute(_admin_url(), f'CREATE DATABASE "{name}"')
    try:
        url = _postgres_url(name)
        if migrated:
            _migrate(url)
        yield url
    finally:
        _execute(_admin_url(), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def fresh_database(kind: str, tmp_path: Path, migrated: MigratedDatabases | None = None) -> Iterator[str]:
    """A database of this test alone: migrated (from the session's `migrated` databases), or empty without."""
    if kind == "sqlite":
        path = tmp_path / "rlctl-test.db"
        yield migrated.sqlite_copy(path) if migrated is not None else f"sqlite:///{path}"
        return
    if migrated is not None:
        with migrated.postgres() as url:
            yield url
    else:
        with _new_postgres(migrated=False) as url:
            yield url
