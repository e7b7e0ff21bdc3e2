"""Keyset pagination cursors: `{created_at in µs since the epoch}-{id}`, newest first."""

from __future__ import annotations

from datetime import UTC, datetime

from service.errors import ValidationFailed

CURSOR_PATTERN = r"^[0-9]{1,16}-[A-Za-z0-9_-]{1,128}$"


def encode_cursor(created_at: datetime, item_id: str) -> str:
    return f"{int(created_at.timestamp() * 1_000_000)}-{item_id}"


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    micros, separator, item_id = cursor.partition("-")
    if not separator or not micros.isdigit() or len(micros) > 16 or not item_id:
        raise ValidationFailed("invalid cursor: pass next_cursor of the previous page", {"field": "cursor"})
    return datetime.fromtimestamp(int(micros) / 1_000_000, UTC), item_id
