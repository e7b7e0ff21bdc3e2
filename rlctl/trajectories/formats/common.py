"""Small helpers shared by the format importers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rlctl.trajectories.convert import INVALID_RECORD, ConversionError


def require_mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConversionError(INVALID_RECORD, f"{what} must be a JSON object")
    return value


def require_list(container: Mapping[str, Any], key: str) -> list[Any]:
    value = container.get(key)
    if not isinstance(value, list):
        raise ConversionError(INVALID_RECORD, f"the item needs a list '{key}'", key)
    return value


def other_keys(item: Mapping[str, Any], consumed: Iterable[str]) -> dict[str, Any]:
    """The item's keys that the conversion did not turn into turns: they become the record's metadata."""
    skipped = set(consumed)
    return {key: value for key, value in item.items() if key not in skipped}


def optional_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def optional_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None
