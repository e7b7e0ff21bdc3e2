"""Fresh databases for tests: a SQLite file, or a new PostgreSQL database dropped afterwards."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from service.settings import normalize_database_url

POSTGRES_URL_VARIABLE = "RLCTL_TEST_POSTGRES_URL"


def database_kinds() -> list[str]:
    """SQLite always; PostgreSQL when RLCTL_TEST_POSTGRES_URL is set (then it must be reachable)."""
    return ["sqlite", "postgresql"] if os.environ.get(POSTGRES_URL_VARIABLE) else ["sqlite"]


@contextmanager
def fresh_database(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'rlctl-test.db'}"
        return
    admin_url = normalize_database_url(os.environ[POSTGRES_URL_VARIABLE])
    name = f"rlctl_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
