"""Loading one row by its id, with the domain's not-found error: the one lookup every service uses."""

from __future__ import annotations

from typing import Any, TypeVar, cast

from sqlalchemy import CursorResult, Executable
from sqlalchemy.orm import Session
from sqlalchemy.orm.interfaces import ORMOption

from rlctl.service.db.models import Base
from rlctl.service.errors import NotFound
from rlctl.service.names import validate_name

RowT = TypeVar("RowT", bound=Base)


def load_row(session: Session, model: type[RowT], row_id: str, not_found: type[NotFound], *options: ORMOption) -> RowT:
    """The row, or `not_found` (404) naming the id; an id that is not a valid name is INVALID_NAME (422).
    `options` are loader options, e.g. relationships to load in the same statement."""
    validate_name(row_id, f"{not_found.subject} id")
    row = session.get(model, row_id, options=options)
    if row is None:
        raise not_found.for_id(row_id)
    return row


def changed_rows(session: Session, statement: Executable) -> int:
    """How many rows an UPDATE changed: 1 when a compare-and-set won, 0 when it lost."""
    # An UPDATE's result is a CursorResult (it has rowcount); Session.execute is typed to return a Result.
    return cast("CursorResult[Any]", session.execute(statement)).rowcount
