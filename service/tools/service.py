"""Listing and calling tools for a tool session (the one implementation behind /tools and /mcp)."""

from __future__ import annotations

from typing import Any

from service.context import AppContext
from service.tools import sessions
from service.tools.catalog import ALL_TOOLS, find_tool
from service.tools.registry import invoke


def list_tools() -> dict[str, Any]:
    return {"tools": [tool.openai_schema() for tool in ALL_TOOLS], "count": len(ALL_TOOLS)}


def call_tool(ctx: AppContext, name: str, arguments: Any, session_header: str | None) -> dict[str, Any]:
    tool = find_tool(name)
    state = sessions.load(ctx, sessions.session_id_from(session_header))
    return invoke(ctx, tool, state, arguments)
