"""The tokens file: names, scopes and SHA-256 hashes of tokens, never the tokens (docs/AUTH.md#the-tokens-file).

The service re-reads the file when it changes (stat on each request), so `rlctl tokens create|revoke` takes effect
without a restart. Writers hold an exclusive lock on a sibling lock file and replace the file atomically.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlctl.service.auth.scopes import Scope, parse_scopes
from rlctl.service.names import NAME_PATTERN

TOKEN_PREFIX = "rlctl_"
ENV_TOKEN_NAME = "RLCTL_API_TOKEN"  # how the token of the setting is named in logs and run records


@dataclass(frozen=True)
class Principal:
    """Who acted: a token's name and scopes (never the token)."""

    name: str
    scopes: tuple[Scope, ...]


ANONYMOUS = Principal("anonymous", (Scope.ADMIN,))  # a server with no token at all (loopback only)


@dataclass(frozen=True)
class TokenEntry:
    name: str
    scopes: tuple[Scope, ...]
    sha256: str
    created_at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "scopes": [s.value for s in self.scopes],
            "sha256": self.sha256,
            "created_at": self.created_at,
        }


class TokenFileError(ValueError):
    """The tokens file or a change to it is not valid; the message says what."""


def token_hash(token: str) -> str:
    # Tokens are 256 random bits, so a plain digest cannot be guessed back; a slow, salted hash is for passwords.
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def parse_entries(text: str) -> tuple[TokenEntry, ...]:
    """The entries of a tokens file's text; raises TokenFileError when it is not a valid file."""
    try:
        raw = json.loads(text) if text.strip() else {"tokens": []}
        entries = tuple(
            TokenEntry(
                name=str(item["name"]),
                scopes=parse_scopes(item["scopes"]),
                sha256=str(item["sha256"]).lower(),
                created_at=str(item.get("created_at", "")),
            )
            for item in raw["tokens"]
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise TokenFileError(f"the tokens file is not valid: {exc}") from exc
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise TokenFileError("the tokens file names a token twice")
    return entries


class TokenStore:
    """Reads (cached by the file's signature) and changes the tokens file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._signature: tuple[int, int, int] | None = None
        self._entries: tuple[TokenEntry, ...] = ()

    def exists(self) -> bool:
        """A tokens file exists, even an empty one: then every call needs a token (revoking the last one closes
        the server rather than opening it)."""
        return self.path.exists()

    def entries(self) -> tuple[TokenEntry, ...]:
        """The current entries. A file that cannot be parsed grants nothing (fail closed) and raises."""
        return self.read() or ()

    def read(self) -> tuple[TokenEntry, ...] | None:
        """The current entries, or None when there is no file: one stat, which every authenticated request
        costs (an empty file still differs from none, see `exists`). Raises as `entries` does."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return None
        signature = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        with self._lock:
            if signature != self._signature:
                self._entries = parse_entries(self.path.read_text(encoding="utf-8"))
                self._signature = signature
            return self._entries

    def create(self, name: str, scopes: tuple[Scope, ...]) -> str:
        """A new token, stored as its hash; the token itself is returned once and kept nowhere."""
        if not re.fullmatch(NAME_PATTERN, name) or name == ENV_TOKEN_NAME:
            raise TokenFileError(f"invalid token name {name!r}: letters, digits, '_' and '-' (not {ENV_TOKEN_NAME})")
        token = new_token()
        entry = TokenEntry(name, scopes, token_hash(token), datetime.now(UTC).isoformat(timespec="seconds"))
        with self._locked():
            entries = self._read_for_change()
            if any(e.name == name for e in entries):
                raise TokenFileError(f"a token named {name!r} exists; revoke it first")
            self._write((*entries, entry))
        return token

    def revoke(self, name: str) -> None:
        with self._locked():
            entries = self._read_for_change()
            if not any(e.name == name for e in entries):
                raise TokenFileError(f"no token named {name!r}")
            self._write(tuple(e for e in entries if e.name != name))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def _read_for_change(self) -> tuple[TokenEntry, ...]:
        try:
            return parse_entries(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return ()

    def _write(self, entries: tuple[TokenEntry, ...]) -> None:
        text = json.dumps({"tokens": [e.to_json() for e in entries]}, indent=2) + "\n"
        fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".tokens-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temporary, 0o600)
            os.replace(temporary, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise


def find_token(entries: tuple[TokenEntry, ...], token: str) -> Principal | None:
    """The principal of the entry whose hash is the token's, if any."""
    digest = token_hash(token)
    found = None
    for entry in entries:
        if hmac.compare_digest(entry.sha256, digest):  # every entry compared: no early exit to time
            found = Principal(entry.name, entry.scopes)
    return found
