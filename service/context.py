"""What the HTTP layer and the agent tools share: settings, database, catalog (one per process)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.db.engine import Database
from service.environments.catalog import EnvironmentCatalog, child_process_environment
from service.settings import SECRET_ENV_NAMES, Settings


@dataclass
class AppContext:
    settings: Settings
    db: Database
    catalog: EnvironmentCatalog
    runs: Any = None  # the RunManager, set by the app (it needs the context to exist first)


def build_context(settings: Settings) -> AppContext:
    settings.data_path.mkdir(parents=True, exist_ok=True)
    catalog = EnvironmentCatalog(
        directories=lambda: settings.environment_directories,
        schema_timeout_s=settings.schema_timeout_s,
        child_environment=lambda: child_process_environment(set(SECRET_ENV_NAMES)),
    )
    return AppContext(settings=settings, db=Database(settings.sqlalchemy_url), catalog=catalog)
