"""What the HTTP layer, the agent tools and every domain share: the app's context (one per app).

The kernel's own parts are fields (settings, database, tokens, child processes). A domain's per-app object (the
environment catalog, the job runner, the run manager, the tiny model's builder) is a `Component`: the composition
root (rlctl/service/app.py) provides it, and the domain's code asks for it by its type (`JobRunner.of(ctx)`), so the
kernel never imports a domain and every such object is typed where it is used.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Self, TypeVar

from rlctl.service.auth.tokens import TokenStore
from rlctl.service.children import ChildRunner, process_fork_server
from rlctl.service.db.engine import Database
from rlctl.service.observability import Scrubber
from rlctl.service.settings import Settings

logger = logging.getLogger("rlctl.warm_up")
FORK_SERVER_WARM_UP = "fork server"
ComponentType = TypeVar("ComponentType", bound="Component")
WarmUpWork = list[tuple[str, Callable[[], object]]]


class Component:
    """A domain's object that lives as long as its app: provided once by the composition root, found by type."""

    @classmethod
    def of(cls, ctx: AppContext) -> Self:
        return ctx.component(cls)


@dataclass
class AppContext:
    settings: Settings
    db: Database
    replica_id: str
    tokens: TokenStore
    children: ChildRunner
    _components: dict[type[Component], Component] = field(default_factory=dict)
    _lock_file: IO[str] | None = None
    _warm_up: list[threading.Thread] = field(default_factory=list)
    _warm_up_started: bool = False
    _scrubber: tuple[tuple[str, ...], Scrubber] | None = None

    def provide(self, component: Component) -> None:
        """Keep a domain's per-app object; one of each kind."""
        self._components[type(component)] = component

    def component(self, kind: type[ComponentType]) -> ComponentType:
        found = self._components.get(kind)
        if not isinstance(found, kind):
            raise LookupError(f"this app was built without a {kind.__name__}")
        return found

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

    def start_warm_up(self, work: WarmUpWork) -> None:
        """The start-up work a first request would otherwise wait for (docs/RUNS.md#start-up-work), each part in
        a background thread over a child process: the fork server the others are forked from, then the domains'
        `work` (rlctl/service/app.py names it). Requests that need one wait for it, not for a second one."""
        if not self.settings.warm_up or self._warm_up_started:
            return
        self._warm_up_started = True
        if self.children.fork_server is not None:  # first: the children below are forked from it
            work = [(FORK_SERVER_WARM_UP, self.children.fork_server.start), *work]
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
        """The text with every configured secret (and its reversed and base64 copies) replaced by ***."""
        secrets = tuple(self.settings.secret_values)
        if self._scrubber is None or self._scrubber[0] != secrets:  # built once per set of secrets
            self._scrubber = (secrets, Scrubber(secrets))
        return self._scrubber[1](text)


def replica_identity(settings: Settings) -> str:
    """Stable across restarts of one service on one data directory, so it recognises its own runs and jobs."""
    if settings.replica_id:
        return settings.replica_id
    digest = hashlib.sha256(str(settings.data_path).encode()).hexdigest()[:10]
    return f"{socket.gethostname()[:40]}-{digest}"


def build_context(settings: Settings) -> AppContext:
    """The kernel's parts of a context; rlctl/service/app.py provides the domains' components."""
    settings.data_path.mkdir(parents=True, exist_ok=True)
    try:
        settings.data_path.chmod(0o700)  # the database, logs and runs are the service's own (docs/SECURITY.md)
    except PermissionError:
        logging.getLogger("rlctl").warning(
            "the data directory %s is not this user's: its mode is kept", settings.data_path
        )
    return AppContext(
        settings=settings,
        db=Database(settings.sqlalchemy_url),
        replica_id=replica_identity(settings),
        tokens=TokenStore(settings.tokens_path),
        children=ChildRunner(process_fork_server() if settings.fork_server else None),
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
