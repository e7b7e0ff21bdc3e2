"""Tool sessions: each agent's selected environment and pending config, persisted in the database."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from rlctl.service.context import AppContext
from rlctl.service.db.models import ToolSession
from rlctl.service.names import validate_name

DEFAULT_SESSION = "default"  # shared by every caller that names it, and only by them


@dataclass
class SessionState:
    id: str
    selected_environment: str | None = None
    pending_config: dict[str, Any] = field(default_factory=dict)


def session_id_from(header: str | None, connection: str | None = None) -> tuple[str, bool]:
    """(session id, created): the X-Tool-Session header's value, validated; else the session of the MCP
    connection (`connection`, its MCP session id); else a new session, never a shared one. The `default`
    session is used only when a caller names it."""
    if header:
        return validate_name(header, "tool session"), False
    if connection:
        return validate_name(f"mcp-{connection}"[:128], "tool session"), False
    return f"s-{uuid.uuid4().hex}", True


def load(ctx: AppContext, session_id: str) -> SessionState:
    with ctx.db.session() as session:
        row = session.get(ToolSession, session_id)
        if row is None:
            return SessionState(session_id)
        return SessionState(row.id, row.selected_environment, dict(row.pending_config or {}))


def save(ctx: AppContext, state: SessionState) -> None:
    with ctx.db.session() as session:
        row = session.get(ToolSession, state.id)
        if row is None:
            row = ToolSession(id=state.id)
            session.add(row)
        row.selected_environment = state.selected_environment
        row.pending_config = dict(state.pending_config)
