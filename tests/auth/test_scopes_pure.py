"""Scopes and the tokens file, directly: what a scope includes, what the file holds (hashes only), and changes."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from rlctl.service.auth.scopes import Scope, allows, effective, parse_scopes
from rlctl.service.auth.tokens import ENV_TOKEN_NAME, TokenFileError, TokenStore, find_token, token_hash


def test_each_scope_includes_the_ones_below_it() -> None:
    assert effective([Scope.READ]) == {Scope.READ}
    assert effective([Scope.OPERATE]) == {Scope.READ, Scope.OPERATE}
    assert effective([Scope.ADMIN]) == set(Scope)
    assert effective([]) == set()
    assert allows([Scope.OPERATE], Scope.READ) and not allows([Scope.OPERATE], Scope.ADMIN)
    assert not allows([Scope.READ], Scope.OPERATE)


def test_scope_names_are_parsed_and_unknown_ones_refused() -> None:
    assert parse_scopes(["admin", " READ "]) == (Scope.READ, Scope.ADMIN)
    with pytest.raises(ValueError, match="unknown scope 'root'"):
        parse_scopes(["root"])
    with pytest.raises(ValueError, match="at least one scope"):
        parse_scopes([])


def test_the_file_keeps_hashes_never_tokens(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "tokens.json")
    token = store.create("dashboard", (Scope.READ,))
    text = store.path.read_text()
    assert token not in text and token_hash(token) in text
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    found = find_token(store.entries(), token)
    assert found is not None and found.name == "dashboard" and found.scopes == (Scope.READ,)
    assert find_token(store.entries(), token + "x") is None
    assert [e.name for e in store.entries()] == ["dashboard"]


def test_names_are_unique_valid_and_revocation_is_by_name(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "tokens.json")
    first = store.create("ci", (Scope.OPERATE,))
    with pytest.raises(TokenFileError, match="exists"):
        store.create("ci", (Scope.READ,))
    for bad in ("../x", "", ENV_TOKEN_NAME):
        with pytest.raises(TokenFileError, match="invalid token name"):
            store.create(bad, (Scope.READ,))
    store.revoke("ci")
    assert find_token(store.entries(), first) is None
    with pytest.raises(TokenFileError, match="no token named"):
        store.revoke("ci")


def test_a_change_by_another_writer_is_seen_and_a_broken_file_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    reader, writer = TokenStore(path), TokenStore(path)
    assert reader.entries() == () and reader.read() is None, "no file: no entries, and no file to close the server"
    token = writer.create("late", (Scope.ADMIN,))
    assert find_token(reader.entries(), token) is not None  # no restart, no reload call: the file's signature changed
    path.write_text(json.dumps({"tokens": [{"name": "x", "scopes": ["root"], "sha256": "0"}]}))
    with pytest.raises(TokenFileError):
        reader.entries()
