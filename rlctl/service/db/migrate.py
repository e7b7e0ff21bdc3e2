"""Applying and checking Alembic migrations from code (service start-up, `rlctl db upgrade`, /readyz)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect, text

from rlctl.service.db.engine import Database

MIGRATIONS_DIR = Path(__file__).resolve().parents[3] / "migrations"
# Any constant works; replicas starting together take turns applying migrations on PostgreSQL.
PG_MIGRATION_LOCK_ID = 0x726C63746C


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(db: Database) -> str | None:
    # Read the version table directly: MigrationContext would log two INFO lines per health check.
    with db.engine.connect() as connection:
        if not inspect(connection).has_table("alembic_version"):
            return None
        return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()


def is_schema_current(db: Database) -> bool:
    return current_revision(db) == head_revision()


def upgrade(db: Database, revision: str = "head") -> None:
    with db.engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": PG_MIGRATION_LOCK_ID})
        command.upgrade(alembic_config(connection), revision)


def downgrade(db: Database, revision: str) -> None:
    with db.engine.begin() as connection:
        command.downgrade(alembic_config(connection), revision)
