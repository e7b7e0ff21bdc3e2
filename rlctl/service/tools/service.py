"""Listing and calling tools for a tool session (the one implementation behind /tools and /mcp)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlctl.service.auth.guard import require
from rlctl.service.auth.scopes import Scope, allows
from rlctl.service.auth.tokens import Principal
from rlctl.service.context import AppContext
from rlctl.service.errors import InvalidName
from rlctl.service.observability import actor_var, caller_scopes_var
from rlctl.service.tools import sessions
from rlctl.service.tools.catalog import ALL_TOOLS, find_tool
from rlctl.service.tools.registry import Tool, ToolNotFound, invoke


def visible_tools(principal: Principal) -> list[Tool[Any]]:
    """The tools this token may call: the only ones it is shown."""
    return [tool for tool in ALL_TOOLS if tool.scope is not None and allows(principal.scopes, tool.scope)]


def list_tools(ctx: AppContext, principal: Principal) -> list[dict[str, Any]]:
    """The function-calling schema (strict) of every tool the token may call, described with this server's
    settings."""
    return [tool.openai_schema(ctx.settings) for tool in visible_tools(principal)]


def authorize_tool(principal: Principal, name: str) -> Tool[Any]:
    """The tool, when it exists and the token holds its scope: else ToolNotFound (listing only the tools this
    token may call) or InsufficientScope."""
    try:
        tool = find_tool(name)
    except ToolNotFound:
        visible = [tool.name for tool in visible_tools(principal)]
        raise ToolNotFound(f"no tool named {name!r}", {"available": visible}) from None
    require(principal, tool.scope or Scope.ADMIN, f"the tool {name!r}")
    return tool


@dataclass(frozen=True)
class ToolCall:
    result: dict[str, Any]
    session: str  # the name of the tool session the call ran in


def call_tool(
    ctx: AppContext,
    name: str,
    arguments: Any,
    session_header: str | None,
    principal: Principal,
    connection: str | None = None,
) -> ToolCall:
    """The tool's result as a JSON object; an `error` field says it failed (never raised, but for an unknown
    tool name, a missing scope or a bad X-Tool-Session header). The call runs in the token's session named by
    the `tool_session` argument, the header, the MCP connection, else `default` (docs/ARCHITECTURE.md#tool-sessions)."""
    tool = authorize_tool(principal, name)
    actor_var.set(principal.name)  # records the tool creates name the token (this runs in a worker thread)
    caller_scopes_var.set(frozenset(scope.value for scope in principal.scopes))
    session_name = sessions.session_name(None, session_header, connection)
    explicit = arguments.get(sessions.SESSION_ARGUMENT) if tool.stateful and isinstance(arguments, dict) else None
    if explicit is not None:
        try:
            session_name = sessions.session_name(explicit if isinstance(explicit, str) else "/", None)
        except InvalidName as error:  # the argument's problem: a tool result, as for any other argument
            problem = {"error": error.message, "code": "VALIDATION_ERROR", "argument": sessions.SESSION_ARGUMENT}
            return ToolCall(problem, session_name)
    state = sessions.load(ctx, principal.name, session_name)
    return ToolCall(invoke(ctx, tool, state, arguments), session_name)
