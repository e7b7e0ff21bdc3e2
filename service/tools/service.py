"""Listing and calling tools for a tool session (the one implementation behind /tools and /mcp)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.context import AppContext
from service.tools import sessions
from service.tools.catalog import ALL_TOOLS, find_tool
from service.tools.registry import invoke


def list_tools(ctx: AppContext) -> list[dict[str, Any]]:
    """Every tool's function-calling schema (strict), described with this server's settings."""
    return [tool.openai_schema(ctx.settings) for tool in ALL_TOOLS]


@dataclass(frozen=True)
class ToolCall:
    result: dict[str, Any]
    session_id: str  # the tool session the call ran in
    created: bool  # a new session, because the call named none


def call_tool(
    ctx: AppContext, name: str, arguments: Any, session_header: str | None, connection: str | None = None
) -> ToolCall:
    """The tool's result as a JSON object; an `error` field says it failed (never raised, but for an unknown
    tool name). A call that names no session (and comes on no MCP connection) runs in a new one."""
    tool = find_tool(name)
    session_id, created = sessions.session_id_from(session_header, connection)
    state = sessions.load(ctx, session_id)
    return ToolCall(invoke(ctx, tool, state, arguments), session_id, created)
