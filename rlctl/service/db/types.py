"""Column types that behave the same on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import overload

from sqlalchemy import DateTime
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every engine (SQLite drops the zone; this puts it back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: object) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: object) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


@overload
def utc_value(value: datetime | str) -> datetime: ...
@overload
def utc_value(value: None) -> None: ...
def utc_value(value: datetime | str | None) -> datetime | None:
    """What a UTCDateTime column reads as, from the driver's own value: SQLite's text (SQLAlchemy writes
    `YYYY-MM-DD HH:MM:SS.ffffff`, in UTC) or PostgreSQL's datetime, for a column selected without its type
    (`type_coerce(column, NullType())`): GET /runs reads its rows' created_at that way, and converts only the one
    its next cursor needs."""
    if value is None:
        return None
    if isinstance(value, str):
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)
