"""Read plans: a read written once for both ways of running it.

A plan is a generator that yields each statement (`Read`) and is sent back its rows, then returns its result:
`Database.run_plan` runs one on a read connection in a thread (or `run_plan_on` inside a unit of work), and
`Database.loop_read` on the event loop (docs/ARCHITECTURE.md#database-access-servicedb).

Only runs' two hottest reads use this (`GET /runs`, `GET /runs/{id}`: rlctl/service/runs/service.py, and
`admission.queue_positions_plan` for their queued runs; and `/readyz`'s one-row read, so that a probe never
waits for a worker thread), with `rlctl/service/db/loop_reads.py` (the drivers' own connections),
`rlctl/service/db/shared_reads.py` (identical reads share one), `rlctl/service/db/json_sql.py` (a page's JSON
written by the database) and `rlctl/service/runs/record_bodies.py` (a record's body kept by its inputs); every other
read is a `Database.read()` session in the thread pool.

Kept by measurement (issue 36), against those two reads on that ordinary path (`Database.read()` in the thread
pool, into RunList and RunOut), alternating the two on one shared 2-core machine:
- `benchmarks/read_cpu.py [--postgres URL]`, CPU per read as a share of /healthz's (2 rounds each): a page of 50
  runs 0.47-0.51 here against 0.26-0.27 (SQLite), 0.42-0.44 against 0.22-0.25 (PostgreSQL); a run's record
  0.55-0.56 against 0.24-0.25, 0.47-0.50 against 0.18-0.25: the ordinary path costs twice the CPU.
- `benchmarks/runs.py --reads-only [--training] --seconds 5 --postgres URL`, req/s as a share of /healthz's
  (3 rounds each): the pages (4 connections) 0.27-0.80 here against 0.10-0.36; a record under 200 connections
  0.47-0.89 against 0.24-0.54.
- Again with issue 40's cuts (the gate's declarations, the collector, rlctl/service/heap.py, which the ordinary
  path shares), `benchmarks/runs.py --reads-only --training --postgres URL`, 200 connections, with a run training:
  GET /runs/{id} 0.56 here against 0.14 (SQLite), 0.72-0.74 against 0.10 (PostgreSQL); `?limit=20` 0.57 against
  0.10 (SQLite): the ordinary path, a worker thread per read, meets neither issue 40's goals.
Delete this and those modules (the routes then run service.get_run and service.list_runs in the thread pool) when
that ordinary path meets issue 18's read goals in `benchmarks/runs.py` on both engines (every read >= 0.5 of
/healthz's req/s; under 200 connections p99 <= 2x /healthz's and no error), e.g. with a cheaper hand-off to a
worker thread or a free-threaded interpreter, or when those goals are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from sqlalchemy import Connection, Executable, Row
from sqlalchemy.orm import Session

T = TypeVar("T")


@dataclass(frozen=True)
class Read:
    """One statement of a read plan (a SELECT), with its bound values."""

    statement: Executable
    parameters: Mapping[str, Any] = field(default_factory=dict)


# What a plan is sent back: its statement's rows, each read by position and by name (SQLAlchemy's Row on a
# Connection; a named tuple of the same values on the event loop's PostgreSQL connections).
ReadPlan = Generator[Read, Sequence[Row[Any]], T]


def run_plan_on(connection: Connection | Session, plan: ReadPlan[T]) -> T:
    """A read plan's result, its statements run on `connection` (a session's, inside its unit of work)."""
    return run_plan_with(plan, lambda read: connection.execute(read.statement, read.parameters).all())


def run_plan_with(plan: ReadPlan[T], rows_of: Callable[[Read], Sequence[Any]]) -> T:
    """A read plan's result, each of its statements' rows from `rows_of` (a connection's, or a driver's own)."""
    try:
        read = next(plan)
        while True:
            read = plan.send(rows_of(read))
    except StopIteration as done:
        return cast(T, done.value)
