"""What the HTTP layer and the agent tools share: settings, database, catalog, runs, jobs (one per process)."""

from __future__ import annotations

import fcntl
import hashlib
import socket
from dataclasses import dataclass
from typing import IO, Any

from service.auth.tokens import TokenStore
from service.db.engine import Database
from service.environments.catalog import EnvironmentCatalog, child_process_environment
from service.settings import SECRET_ENV_NAMES, Settings


@dataclass
class AppContext:
    settings: Settings
    db: Database
    catalog: EnvironmentCatalog
    replica_id: str
    tokens: TokenStore
    runs: Any = None  # the RunManager, set by the app (it needs the context to exist first)
    jobs: Any = None  # the JobRunner, likewise
    _lock_file: IO[str] | None = None

    def claim_data_dir(self) -> None:
        """One service per data directory: two would both think they own the same runs."""
        path = self.settings.data_path / "replica.lock"
        handle = path.open("w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            handle.close()
            raise RuntimeError(f"another rlctl service uses the data directory {path.parent}") from exc
        self._lock_file = handle

    def release_data_dir(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def scrub(self, text: str) -> str:
        """The text with every configured secret replaced by ***."""
        for secret in self.settings.secret_values:
            text = text.replace(secret, "***")
        return text


def replica_identity(settings: Settings) -> str:
    """Stable across restarts of one service on one data directory, so it recognises its own runs and jobs."""
    if settings.replica_id:
        return settings.replica_id
    digest = hashlib.sha256(str(settings.data_path).encode()).hexdigest()[:10]
    return f"{socket.gethostname()[:40]}-{digest}"


def build_context(settings: Settings) -> AppContext:
    settings.data_path.mkdir(parents=True, exist_ok=True)
    catalog = EnvironmentCatalog(
        directories=lambda: settings.environment_directories,
        schema_timeout_s=settings.schema_timeout_s,
        child_environment=lambda: child_process_environment(set(SECRET_ENV_NAMES)),
    )
    return AppContext(
        settings=settings,
        db=Database(settings.sqlalchemy_url),
        catalog=catalog,
        replica_id=replica_identity(settings),
        tokens=TokenStore(settings.tokens_path),
    )
