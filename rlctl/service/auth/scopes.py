"""Scopes: what a token may do. Pure logic, no I/O (docs/AUTH.md#scopes)."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class Scope(StrEnum):
    READ = "read"  # GET routes and read-only tools
    OPERATE = "operate"  # runs, datasets, jobs, collections, inference tests
    ADMIN = "admin"  # environment code, tokens, everything


# Each scope includes the ones below it: an operator can read, an admin can operate.
_RANK = {Scope.READ: 0, Scope.OPERATE: 1, Scope.ADMIN: 2}


def effective(scopes: Iterable[Scope]) -> frozenset[Scope]:
    """The scopes a token holds, the included ones added: {operate} is {read, operate}."""
    top = max((_RANK[s] for s in scopes), default=-1)
    return frozenset(s for s, rank in _RANK.items() if rank <= top)


def allows(scopes: Iterable[Scope], needed: Scope) -> bool:
    return needed in effective(scopes)


def parse_scopes(names: Iterable[str]) -> tuple[Scope, ...]:
    """Scope names as given (a file, the command line), in a stable order; an unknown name raises ValueError."""
    parsed = set()
    for name in names:
        try:
            parsed.add(Scope(name.strip().lower()))
        except ValueError:
            raise ValueError(f"unknown scope {name!r}: use one of {', '.join(s.value for s in Scope)}") from None
    if not parsed:
        raise ValueError("a token needs at least one scope")
    return tuple(sorted(parsed, key=_RANK.__getitem__))
