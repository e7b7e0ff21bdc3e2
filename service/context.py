"""What the HTTP layer and the agent tools share: settings, database, catalog, runs, jobs (one per process)."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from service.auth.tokens import TokenStore
from service.children import ChildRunner, process_fork_server
from service.db.engine import Database
from service.environments.catalog import EnvironmentCatalog, child_process_environment
from service.runs.tiny_model import TinyModelBuilder
from service.settings import SECRET_ENV_NAMES, Backend, Settings

logger = logging.getLogger("rlctl.warm_up")
FORK_SERVER_WARM_UP = "fork server"


@dataclass
class AppContext:
    settings: Settings
    db: Database
    catalog: EnvironmentCatalog
    replica_id: str
    tokens: TokenStore
    children: ChildRunner
    tiny_model: TinyModelBuilder
    runs: Any = None  # the RunManager, set by the app (it needs the context to exist first)
    jobs: Any = None  # the JobRunner, likewise
    _lock_file: IO[str] | None = None
    _warm_up: list[threading.Thread] = field(default_factory=list)
    _warm_up_started: bool = False

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

    def start_warm_up(self) -> None:
        """The start-up work a first request would otherwise wait for (docs/RUNS.md#start-up-work), each part in
        a background thread over a child process: the fork server the others are forked from, every environment's
        config schema, and the local backend's tiny model when it is the default backend's model. Requests that
        need one wait for it, not for a second one."""
        if not self.settings.warm_up or self._warm_up_started:
            return
        self._warm_up_started = True
        work: list[tuple[str, Callable[[], object]]] = []
        if self.children.fork_server is not None:  # first: the children below are forked from it
            work.append((FORK_SERVER_WARM_UP, self.children.fork_server.start))
        work.append(("environment schemas", self.catalog.warm))
        if (
            self.settings.effective_default_backend == Backend.LOCAL
            and not self.settings.local_base_model
            and not self.tiny_model.built()
        ):
            work.append(("tiny model", self.tiny_model.ensure))
        for name, task in work:
            thread = threading.Thread(target=_warm, args=(name, task), name=f"warm-up {name}", daemon=True)
            thread.start()
            if name != FORK_SERVER_WARM_UP:
                self._warm_up.append(thread)

    def stop_children(self) -> None:
        """End the service's own child processes still running (warm-up included); waits for their threads, which
        give up at once on a fork server still starting. The server's own start is not waited for: it belongs to
        the process (shared by every app in it), and a closing service forks nothing from it."""
        self.children.close()
        for thread in self._warm_up:
            thread.join(timeout=30)

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
    children = ChildRunner(process_fork_server() if settings.fork_server else None)

    def child_environment() -> dict[str, str]:
        return child_process_environment(set(SECRET_ENV_NAMES))

    catalog = EnvironmentCatalog(
        directories=lambda: settings.environment_directories,
        schema_timeout_s=settings.schema_timeout_s,
        child_environment=child_environment,
        store_dir=settings.schema_store_dir,
        children=children,
    )
    return AppContext(
        settings=settings,
        db=Database(settings.sqlalchemy_url),
        catalog=catalog,
        replica_id=replica_identity(settings),
        tokens=TokenStore(settings.tokens_path),
        children=children,
        tiny_model=TinyModelBuilder(settings.tiny_model_dir, children, child_environment),
    )


def _warm(name: str, task: Callable[[], object]) -> None:
    try:
        task()
    except ChildProcessError:
        logger.debug("warm-up of the %s ended with the service", name)
    except Exception as error:  # noqa: BLE001 - warm-up only saves time: the request that needs it tries again
        logger.warning(
            "warm-up of the %s failed (%s: %s); it is done when first needed", name, type(error).__name__, error
        )
