"""Read plans: a read written once for both ways of running it.

A plan is a generator that yields each statement (`Read`) and is sent back its rows, then returns its result:
`Database.run_plan` runs one on a read connection in a thread (or `run_plan_on` inside a unit of work), and
`Database.loop_read` on the event loop (docs/ARCHITECTURE.md#database-access-servicedb).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
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
    try:
        read = next(plan)
        while True:
            read = plan.send(connection.execute(read.statement, read.parameters).all())
    except StopIteration as done:
        return cast(T, done.value)
