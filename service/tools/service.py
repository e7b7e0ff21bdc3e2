"""Listing and calling tools for a tool session (the one implementation behind /tools and /mcp)."""

from __future__ import annotations

from typing import Any

from service.context import AppContext
from service.tools import sessions
from service.tools.catalog import ALL_TOOLS, find_tool
from service.tools.registry import invoke


def list_tools(ctx: AppContext) -> list[dict[str, Any]]:
    """Every tool's function-calling schema (strict), described with this server's settings."""
    return [tool.openai_schema(ctx.settings) for tool in ALL_TOOLS]


def call_tool(ctx: AppContext, name: str, arguments: Any, session_header: str | None) -> dict[str, Any]:
    """The tool's result as a JSON object; an `error` field says it failed (never raised, but for an unknown
    tool name)."""
    tool = find_tool(name)
    state = sessions.load(ctx, sessions.session_id_from(session_header))
    return invoke(ctx, tool, state, arguments)
