"""Reads on the event loop: SQLAlchemy statements, run on the driver's own connections.

- PostgreSQL (`LoopReads`): psycopg's async connections. SQLAlchemy's async engine costs such a read about twice
  the driver's CPU (its pool's check-out and return, and a greenlet switch at every await of the driver): on a
  page of runs, 0.7 ms against 0.25 ms for the statement itself.
- SQLite (`InProcessReads`): one connection of the engine's, kept for the loop. SQLAlchemy's check-out and
  return of a connection, its execution context and its result rows were 0.035 of a page's 0.27 ms of CPU
  (benchmarks/read_cpu.py), an eighth.

Either way SQLAlchemy still builds and compiles each statement (compiled once per statement object) and its
types still convert the values both ways (`bind_processor`, `result_processor`: the public hooks a type offers a
driver), so a row reads as it would through a Connection: its values by position and by name.

Part of the second read path of runs' two hottest reads: kept by measurement, and deleted when the ordinary path
meets their goals, as rlctl/service/db/plans.py says (figures and condition).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, namedtuple
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from sqlalchemy import Dialect, Engine, Executable, PoolProxiedConnection, Select
from sqlalchemy.engine import make_url

from rlctl.service.db.plans import Read, ReadPlan, run_plan_with
from rlctl.service.errors import InvalidValue, Unavailable

T = TypeVar("T")
COMPILED_KEPT = 64  # statements built once (the hot reads' few) stay compiled; others are compiled per read


@dataclass(frozen=True)
class _Compiled:
    sql: str
    construct_params: Callable[[Mapping[str, Any]], MutableMapping[str, Any]]  # new: given and own values
    bind_processors: dict[str, Callable[[Any], Any]]
    result_processors: tuple[Callable[[Any], Any] | None, ...]
    row: Callable[..., Any]  # a named tuple of the statement's columns
    positions: tuple[str, ...] | None  # the parameters' names in order, for a driver that binds by position

    def parameters(self, given: Mapping[str, Any]) -> MutableMapping[str, Any] | list[Any]:
        values = self.construct_params(given)
        for name, process in self.bind_processors.items():
            if name in values:
                values[name] = process(values[name])
        if self.positions is not None:
            return [values[name] for name in self.positions]
        return values

    def rows(self, fetched: Sequence[tuple[Any, ...]]) -> list[Any]:
        if not any(self.result_processors):
            return [self.row(*values) for values in fetched]
        return [self.row(*self._converted(values)) for values in fetched]

    def _converted(self, values: tuple[Any, ...]) -> list[Any]:
        pairs = zip(self.result_processors, values, strict=True)
        return [value if process is None else process(value) for process, value in pairs]


class CompiledStatements:
    """Statements compiled for one dialect: those built once (the hot reads' few) stay compiled, up to
    COMPILED_KEPT; others are compiled per read."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._compiled: OrderedDict[Executable, _Compiled] = OrderedDict()

    def get(self, statement: Executable) -> _Compiled:
        kept = self._compiled.get(statement)
        if kept is not None:
            self._compiled.move_to_end(statement)
            return kept
        if not isinstance(statement, Select):
            raise TypeError("a read plan's statements are SELECTs")
        compiled = statement.compile(dialect=self._dialect)
        # A list of values (`column.in_(ids)`) is rendered at execution: its values go into the text, and the
        # statement, used once, is not kept.
        expanding = any(bind.expanding for bind in compiled.binds.values())
        if expanding:
            compiled = statement.compile(dialect=self._dialect, compile_kwargs={"render_postcompile": True})
        columns = list(statement.selected_columns)
        result = _Compiled(
            sql=compiled.string,
            construct_params=compiled.construct_params,
            bind_processors={
                name: process
                for name, bind in compiled.binds.items()
                if (process := bind.type.dialect_impl(self._dialect).bind_processor(self._dialect)) is not None
            },
            result_processors=tuple(_result_processor(column.type, self._dialect) for column in columns),
            row=namedtuple("Row", [column.key or "column" for column in columns], rename=True),  # noqa: PYI024
            positions=tuple(compiled.positiontup) if compiled.positional and compiled.positiontup else None,
        )
        if not expanding:
            self._compiled[statement] = result
            if len(self._compiled) > COMPILED_KEPT:
                self._compiled.popitem(last=False)
        return result


class LoopReads:
    """At most `size` reads at once, each on its own connection (in autocommit: a read is one round trip); the
    rest wait their turn, first come, first served, for `wait_s` at most. Opened and closed on the loop that
    uses it."""

    def __init__(self, url: str, dialect: Dialect, size: int, wait_s: float) -> None:
        conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self._pool = AsyncConnectionPool(
            conninfo,
            min_size=1,
            max_size=size,
            open=False,
            kwargs={"autocommit": True},
            name="loop-reads",
            timeout=wait_s,
        )
        self._statements = CompiledStatements(dialect)

    async def open(self) -> None:
        await self._pool.open(wait=False)

    async def close(self) -> None:
        await self._pool.close()

    async def run(self, plan: Callable[[], ReadPlan[T]]) -> T:
        """The plan's result; Unavailable (503) when no connection to the server could be had in time."""
        for attempt in range(2):
            try:
                async with self._pool.connection() as connection:
                    try:
                        return await self._run(connection, plan())
                    except psycopg.OperationalError as error:
                        # Connections are not pinged before each read (a round trip). One the server dropped (a
                        # restart, an idle time-out) fails its first statement, and so would the others it
                        # dropped with it: the pool discards this one and checks the rest, and the read, which
                        # changes nothing, runs again from its start. A statement that failed on a sound
                        # connection fails as on any other read.
                        if not connection.broken:
                            raise
                        if attempt:
                            raise Unavailable("the database cannot be reached: try again") from error
                await self._pool.check()
            except PoolTimeout as error:
                raise Unavailable("the database cannot be reached (or is too busy): try again") from error
        raise AssertionError("unreachable")

    async def _run(self, connection: psycopg.AsyncConnection[Any], plan: ReadPlan[T]) -> T:
        try:
            read = next(plan)
            while True:
                compiled = self._statements.get(read.statement)
                cursor = await connection.execute(compiled.sql, compiled.parameters(read.parameters))
                read = plan.send(compiled.rows(await cursor.fetchall()))
        except StopIteration as done:
            return cast(T, done.value)
        except psycopg.DataError as error:
            # A value PostgreSQL cannot hold (a NUL character in a filter): the caller's, 422 as on the ordinary
            # path (which SQLAlchemy wraps in its DataError), never a 500.
            raise InvalidValue("a value of the request cannot be stored (e.g. a NUL character)") from error


class InProcessReads:
    """SQLite's reads on the event loop: on one connection of the engine's (set up as the pool sets up each), kept
    from `open` to `close`. A SQLite read is a call into the library in this process, a WAL reader waits on no
    writer, and nothing in a plan awaits: a plan runs whole, so one connection serves the loop."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._statements = CompiledStatements(engine.dialect)
        self._connection: PoolProxiedConnection | None = None
        self._lock = threading.Lock()  # a second loop in this process (tests run several apps) waits its turn

    def open(self) -> None:
        self._connection = self._engine.raw_connection()

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()  # back to the engine's pool

    def run(self, plan: ReadPlan[T]) -> T:
        if self._connection is None:
            raise RuntimeError("InProcessReads.run before open")
        with self._lock:
            cursor = self._connection.cursor()
            try:
                return run_plan_with(plan, lambda read: self._rows(cursor, read))
            finally:
                cursor.close()

    def _rows(self, cursor: Any, read: Read) -> list[Any]:
        compiled = self._statements.get(read.statement)
        cursor.execute(compiled.sql, compiled.parameters(read.parameters))
        return compiled.rows(cursor.fetchall())


def _result_processor(type_: Any, dialect: Dialect) -> Callable[[Any], Any] | None:
    """The conversion of a column's values from the driver, as the dialect does it (SQLite's datetimes are text)."""
    processor: Callable[[Any], Any] | None = type_.dialect_impl(dialect).result_processor(dialect, None)
    return processor
