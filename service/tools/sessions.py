"""Tool sessions: each agent's selected environment and pending config, persisted in the database."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from service.context import AppContext
from service.db.models import ToolSession
from service.names import validate_name

DEFAULT_SESSION = "default"


@dataclass
class SessionState:
    id: str
    selected_environment: str | None = None
    pending_config: dict[str, Any] = field(default_factory=dict)


def session_id_from(header: str | None) -> str:
    """The X-Tool-Session header's value, validated; the default session when absent."""
    if not header:
        return DEFAULT_SESSION
    return validate_name(header, "tool session")


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
