"""Validation of names that end up in paths or URLs: no traversal, no separators, no control characters."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Path

from rlctl.service.errors import InvalidName

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
_NAME = re.compile(NAME_PATTERN)


def validate_name(value: str, kind: str = "name") -> str:
    if not _NAME.fullmatch(value):
        raise InvalidName(
            f"invalid {kind} {value!r}: use letters, digits, '_' and '-', at most 128 characters,"
            " starting with a letter or digit",
            {"kind": kind, "value": value},
        )
    return value


def name_path(description: str) -> object:
    """A path parameter documented with the name pattern; the service checks it and answers INVALID_NAME."""
    return Path(description=description, json_schema_extra={"pattern": NAME_PATTERN})


EnvironmentName = Annotated[str, name_path("Environment name, as listed by GET /environments.")]
