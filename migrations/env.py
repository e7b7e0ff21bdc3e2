"""Alembic environment: runs on the connection rlctl hands over (rlctl/service/db/migrate.py)."""

from __future__ import annotations

from alembic import context

from rlctl.service.db.models import Base


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:
        raise RuntimeError("run migrations through `rlctl db upgrade`, which provides the connection")
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # SQLite cannot ALTER most things in place: batch mode copies the table.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
