"""Engine and session factories, with the pool and SQLite settings a multi-threaded service needs."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from rlctl.service.db.loop_reads import InProcessReads, LoopReads
from rlctl.service.db.plans import ReadPlan, run_plan_on
from rlctl.service.db.shared_reads import SharedReads
from rlctl.service.settings import normalize_database_url

SQLITE_BUSY_TIMEOUT_MS = 30_000
P = ParamSpec("P")
T = TypeVar("T")
# Request handlers run in the event loop's worker threads; the service sets their number to REQUEST_THREADS
# at start-up. Each holds at most one connection at a time, so the pool keeps one for each of them, plus the
# background threads' (run heartbeats and supervision, job workers): a smaller pool makes every thread beyond
# it open a connection (and set it up) per request, then close it.
# On SQLite the event loop's thread is one more (its reads: Database.loop_read).
REQUEST_THREADS = 40
BACKGROUND_CONNECTIONS = 10
POOL_SIZE = REQUEST_THREADS + BACKGROUND_CONNECTIONS + 1
POOL_OVERFLOW = 10  # bursts beyond that (many runs supervised at once) open extra connections
# PostgreSQL's reads on the event loop (Database.loop_read): as many at once, and the rest wait their turn, at
# most so long for a connection (then 503 UNAVAILABLE: the server is gone, or far too busy).
LOOP_READ_CONNECTIONS = 8
LOOP_READ_WAIT_S = 10.0
# /readyz's read has a connection of its own: behind 200 queued reads a probe waited seconds for one of the eight.
PROBE_READ_CONNECTIONS = 1


class ReadOnlySession(Session):
    """A session for reads: there is no transaction to commit, and writing through it is a programming error."""

    def flush(self, objects: Any = None) -> None:
        if self.new or self.dirty or self.deleted:
            raise RuntimeError("a read-only session cannot write; use Database.session()")


class Database:
    def __init__(self, url: str) -> None:
        self.url = normalize_database_url(url)
        self.engine = _create_engine(self.url)
        # SQLite is a file this process reads itself; PostgreSQL a server, a round trip away (or gone).
        self.in_process = self.engine.dialect.name == "sqlite"
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._read_engine = _read_engine(self.engine)
        self._reads = sessionmaker(self._read_engine, class_=ReadOnlySession, expire_on_commit=False)
        self._loop_reads: LoopReads | None = None
        self._probe_reads: LoopReads | None = None
        self._in_process_reads: InProcessReads | None = None
        self._shared_reads = SharedReads()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A unit of work: committed when the block ends, rolled back on error."""
        with self._sessions() as session, session.begin():
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        """Reads only: no BEGIN or COMMIT round trips, each statement sees the latest committed data."""
        with self._reads() as session:
            yield session

    @contextmanager
    def read_connection(self) -> Iterator[Connection]:
        """Reads in plain SQL (Core statements, rows as tuples): the connection `read()` uses, without the session
        and its set-up around it. For the hottest reads (a run's record, a page of runs); SELECTs only."""
        with self._read_engine.connect() as connection:
            yield connection

    def run_plan(self, plan: ReadPlan[T]) -> T:
        """A read plan's result, its statements run here on one read connection (for callers in a thread)."""
        with self.read_connection() as connection:
            return run_plan_on(connection, plan)

    async def loop_read(self, plan: Callable[P, ReadPlan[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """`plan(*args, **kwargs)`'s result, from an async route, on the event loop: for reads that are an index
        walk or two and a small file at most (a run's record, a page of runs), never a write. A worker thread
        costs such a read more than the read itself: under load each hop waits for the interpreter's lock.
        - SQLite: the statements run here, in this process (a WAL reader waits on no writer), on the connection
          `open_loop_reads` kept (`rlctl/service/db/loop_reads.py`; a read connection of the pool before that).
        - PostgreSQL: a server can be slow or gone, so its statements are awaited, on the connections
          `open_loop_reads` opened (`rlctl/service/db/loop_reads.py`; the thread pool before that)."""
        if self.in_process:
            if self._in_process_reads is None:
                return self.run_plan(plan(*args, **kwargs))
            return self._in_process_reads.run(plan(*args, **kwargs))
        if self._loop_reads is None:
            return await run_in_threadpool(lambda: self.run_plan(plan(*args, **kwargs)))
        return await self._loop_reads.run(lambda: plan(*args, **kwargs))

    async def shared_read(self, key: Hashable, plan: Callable[P, ReadPlan[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """As `loop_read`, for reads that `key` names whole (the same key, the same answer): on PostgreSQL, callers
        of one key share a run begun after they asked (`rlctl/service/db/shared_reads.py`). The answer is shared,
        so it must not be changed. SQLite's reads do not wait, so each runs its own."""
        if self.in_process:
            return await self.loop_read(plan, *args, **kwargs)
        return await self._shared_reads.read(key, lambda: self.loop_read(plan, *args, **kwargs))

    async def probe_read(self, plan: Callable[[], ReadPlan[T]]) -> T:
        """As `loop_read`, for a probe (`/readyz`): on PostgreSQL on a connection of its own, never queued behind
        the other reads waiting for theirs (docs/ARCHITECTURE.md#performance)."""
        if self._probe_reads is None:
            return await self.loop_read(plan)
        return await self._probe_reads.run(plan)

    async def open_loop_reads(self) -> None:
        """The connections of `loop_read` and `probe_read`: on PostgreSQL, they belong to the running loop."""
        if self.in_process and self._in_process_reads is None:
            self._in_process_reads = InProcessReads(self._read_engine)
            self._in_process_reads.open()
        if not self.in_process and self._loop_reads is None:
            self._loop_reads = LoopReads(self.url, self.engine.dialect, LOOP_READ_CONNECTIONS, LOOP_READ_WAIT_S)
            await self._loop_reads.open()
            self._probe_reads = LoopReads(self.url, self.engine.dialect, PROBE_READ_CONNECTIONS, LOOP_READ_WAIT_S)
            await self._probe_reads.open()

    async def close_loop_reads(self) -> None:
        if self._in_process_reads is not None:
            self._in_process_reads.close()
            self._in_process_reads = None
        for name in ("_loop_reads", "_probe_reads"):
            reads = getattr(self, name)
            if reads is not None:
                setattr(self, name, None)
                await reads.close()

    def dispose(self) -> None:
        self.engine.dispose()


def _create_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": 30},
        pool_size=POOL_SIZE,
        max_overflow=POOL_OVERFLOW,
    )
    event.listen(engine, "connect", _configure_sqlite_connection)  # once per connection: the pool keeps them
    return engine


def _read_engine(engine: Engine) -> Engine:
    """The engine of read sessions. On PostgreSQL its connections are in autocommit mode while checked out: a
    read is one round trip, not BEGIN, SELECT, COMMIT. SQLite's driver begins a transaction only before a write
    and its COMMIT of nothing is free, so reads there use the engine as it is (switching modes would run a pragma
    per checkout)."""
    if engine.dialect.name == "sqlite":
        return engine
    return engine.execution_options(isolation_level="AUTOCOMMIT")


def _configure_sqlite_connection(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
