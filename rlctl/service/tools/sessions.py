"""Tool sessions: each agent's selected environment and pending config, persisted in the database.

A call's session is named, first match wins, by the tool's `tool_session` argument, the `X-Tool-Session` header,
the MCP session id (clients of the handshake-era protocol), else `default`. A session belongs to the token that
uses it: it is stored under a hash of the token's name and the session's name, so two tokens naming the same
session never share it (docs/ARCHITECTURE.md#tool-sessions).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from rlctl.service.context import AppContext
from rlctl.service.db.models import ToolSession
from rlctl.service.names import NAME_PATTERN, validate_name

DEFAULT_SESSION = "default"  # each token's own session, used by calls that name none
SESSION_ARGUMENT = "tool_session"  # the argument of every tool that reads or writes the session
SESSION_ARGUMENT_SCHEMA: dict[str, Any] = {
    "anyOf": [{"type": "string", "pattern": NAME_PATTERN}, {"type": "null"}],
    "description": "The tool session to work in (selected environment, pending config); null: the X-Tool-Session "
    "header's, else the MCP session's, else this token's `default` session.",
}


@dataclass
class SessionState:
    id: str  # the storage key: a hash of the token's name and the session's name
    selected_environment: str | None = None
    pending_config: dict[str, Any] = field(default_factory=dict)
    name: str = DEFAULT_SESSION


def session_name(argument: str | None, header: str | None, connection: str | None = None) -> str:
    """The session's name, validated: the tool's argument, the X-Tool-Session header, the MCP session id, else
    `default`."""
    if argument:
        return validate_name(argument, "tool session")
    if header:
        return validate_name(header, "tool session")
    if connection:
        return validate_name(f"mcp-{connection}"[:128], "tool session")
    return DEFAULT_SESSION


def storage_key(token_name: str, name: str) -> str:
    """The row id of `token_name`'s session `name`: the same name under another token is another session."""
    return hashlib.sha256(f"{token_name}\0{name}".encode()).hexdigest()


def load(ctx: AppContext, token_name: str, name: str) -> SessionState:
    key = storage_key(token_name, name)
    with ctx.db.session() as session:
        row = session.get(ToolSession, key)
        if row is None:
            return SessionState(key, name=name)
        return SessionState(row.id, row.selected_environment, dict(row.pending_config or {}), name)


def save(ctx: AppContext, state: SessionState) -> None:
    with ctx.db.session() as session:
        row = session.get(ToolSession, state.id)
        if row is None:
            row = ToolSession(id=state.id)
            session.add(row)
        row.selected_environment = state.selected_environment
        row.pending_config = dict(state.pending_config)
