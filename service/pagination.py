"""Keyset pagination, newest first: cursors are `{created_at in µs since the epoch}-{id}`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from fastapi import Query
from sqlalchemy import Select, and_, or_
from sqlalchemy.orm import Session

from service.errors import ValidationFailed

CURSOR_PATTERN = r"^[0-9]{1,16}-[A-Za-z0-9_-]{1,128}$"
MAX_PAGE = 200
DEFAULT_PAGE = 50

# The query parameters of every keyset-paged listing.
PageLimit = Annotated[int, Query(ge=1, le=MAX_PAGE)]
PageCursor = Annotated[str | None, Query(pattern=CURSOR_PATTERN, description="`next_cursor` of the page before.")]

RowT = TypeVar("RowT")
ItemT = TypeVar("ItemT")


def encode_cursor(created_at: datetime, item_id: str) -> str:
    return f"{int(created_at.timestamp() * 1_000_000)}-{item_id}"


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    micros, separator, item_id = cursor.partition("-")
    if not separator or not micros.isdigit() or len(micros) > 16 or not item_id:
        raise ValidationFailed("invalid cursor: pass next_cursor of the previous page", {"field": "cursor"})
    return datetime.fromtimestamp(int(micros) / 1_000_000, UTC), item_id


def newest_first_page(
    session: Session,
    query: Select[*tuple[Any, ...]],
    model: Any,
    limit: int,
    cursor: str | None,
    to_record: Callable[[RowT], ItemT],
) -> tuple[list[ItemT], str | None]:
    """One page of `query` over `model` (with `created_at` and `id`), and the cursor of the next page (or None).
    `limit` is the caller's, within 1..MAX_PAGE (the routes' PageLimit). Either `model` is a mapped class and
    `query` selects it (rows are its objects), or `model` is a table's columns (`Model.__table__.c`) and `query`
    selects some of them, `created_at` and `id` among them (rows are tuples with those names): a listing loads
    only the columns it returns, as plain SQL."""
    if cursor:
        created_at, last_id = decode_cursor(cursor)
        query = query.where(
            or_(model.created_at < created_at, and_(model.created_at == created_at, model.id < last_id))
        )
    result = session.execute(query.order_by(model.created_at.desc(), model.id.desc()).limit(limit + 1))
    # Told by `model`, not by the statement's column descriptions: working those out cost a third of a page.
    rows: list[Any] = list(result.scalars().all() if isinstance(model, type) else result.all())
    page = rows[:limit]
    next_cursor = encode_cursor(page[-1].created_at, page[-1].id) if len(rows) > limit else None
    return [to_record(row) for row in page], next_cursor
