"""The same tools over MCP (streamable HTTP at /mcp), through the official SDK, behind the same tokens and scopes.

Tools are listed with their input and output schemas and read-only / destructive / idempotent hints; a call
runs the one implementation in rlctl/service/tools/service.py, in the agent's tool session: X-Tool-Session when the
client sends it, else one per MCP session.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.types import Message, Receive, Scope, Send

from rlctl.service.auth.guard import identify, is_open
from rlctl.service.auth.tokens import Principal
from rlctl.service.context import AppContext
from rlctl.service.errors import ServiceError
from rlctl.service.http import error_response
from rlctl.service.runs.ratelimit import describe_interval
from rlctl.service.settings import Settings
from rlctl.service.tools import service
from rlctl.service.tools.catalog import ALL_TOOLS
from rlctl.service.tools.registry import Tool
from rlctl.service.tools.service import authorize_tool

INVALID_PARAMS = -32602
TOOL_NAMES = frozenset(tool.name for tool in ALL_TOOLS)  # an unknown name stays MCP's own error


def instructions(settings: Settings) -> str:
    interval = describe_interval(settings.status_check_interval_s)
    return (
        "rlctl trains language models with reinforcement learning. List environments, select one, look at and edit "
        f"its config, start training, then check the run's status at most once per {interval} per run."
    )


class NoEventStream(ServiceError):
    status_code = 405
    code = "METHOD_NOT_ALLOWED"

    def __init__(self) -> None:
        super().__init__("this MCP endpoint offers no server-sent event stream: POST requests only")


class McpEndpoint:
    """The ASGI app mounted at /mcp, and the session manager whose lifetime the service's lifespan holds."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        server = Server(
            "rlctl",
            version="0.1.0",
            instructions=instructions(ctx.settings),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self.manager = StreamableHTTPSessionManager(
            app=server,
            json_response=True,
            # Stateful: each MCP session gets an id, and its tool session with it (never a shared one).
            stateless=False,
            security_settings=self._transport_security(),
        )
        self._app = StreamableHTTPASGIApp(self.manager)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.manager.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            principal = identify(self.ctx.settings, self.ctx.tokens, _header(scope, b"authorization"))
            remember_in_scope(scope, principal)
            if scope.get("method") == "POST":
                body = await _read_body(receive)
                for name in _called_tools(body):  # a scope problem is a 403, as on /tools
                    if name in TOOL_NAMES:
                        authorize_tool(principal, name)
                receive = _replay(body, receive)
        except ServiceError as error:
            await error_response(error)(scope, receive, send)
            return
        if scope.get("method") == "GET":
            # Stateless: the server never sends a message of its own, so a GET event stream would only stay open
            # (300 idle streams held 339 descriptors). MCP lets a server without one answer 405.
            await error_response(NoEventStream())(scope, receive, send)
            return
        await self._app(scope, receive, send)

    def _transport_security(self) -> TransportSecuritySettings:
        if not is_open(self.ctx.settings, tokens_file=self.ctx.tokens.exists()):
            # Token-protected and possibly behind a proxy: the token, not the Host header, guards it.
            return TransportSecuritySettings(enable_dns_rebinding_protection=False)
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )

    def _principal(self, request: Any) -> Principal:
        """The caller, identified again from the HTTP request the MCP message came in (checked in __call__)."""
        http_request = getattr(request, "request", None)
        return identify(
            self.ctx.settings,
            self.ctx.tokens,
            http_request.headers.get("authorization") if http_request is not None else None,
        )

    async def _list_tools(self, request: Any, _params: Any) -> types.ListToolsResult:
        tools = service.visible_tools(self._principal(request))
        return types.ListToolsResult(tools=[mcp_tool(tool, self.ctx.settings) for tool in tools])

    async def _call_tool(self, request: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        http_request = getattr(request, "request", None)
        headers = http_request.headers if http_request is not None else {}
        session_header, connection = headers.get("x-tool-session"), headers.get("mcp-session-id")
        principal = self._principal(request)
        try:
            call = await anyio.to_thread.run_sync(
                service.call_tool, self.ctx, params.name, params.arguments or {}, session_header, principal, connection
            )
        except ServiceError as exc:  # an unknown tool, a bad X-Tool-Session: the caller's error, with its code
            raise MCPError(INVALID_PARAMS, exc.message, {"code": exc.code, **exc.details}) from exc
        result = call.result
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(result))],
            structured_content=result,
            is_error="error" in result,
        )


def mcp_tool(tool: Tool[Any], settings: Settings) -> types.Tool:
    return types.Tool(
        name=tool.name,
        description=tool.describe(settings),
        input_schema=tool.input_schema,
        output_schema=tool.output_schema,
        annotations=types.ToolAnnotations(
            read_only_hint=tool.hints.read_only,
            destructive_hint=tool.hints.destructive,
            idempotent_hint=tool.hints.idempotent,
            open_world_hint=tool.hints.open_world,
        ),
    )


def _header(scope: Scope, name: bytes) -> str | None:
    value = dict(scope.get("headers", [])).get(name)
    return value.decode("latin-1") if value is not None else None


def remember_in_scope(scope: Scope, principal: Principal) -> None:
    """The acting token's name for the access log, as `remember` does for the routes."""
    scope.setdefault("state", {})["token_name"] = principal.name


async def _read_body(receive: Receive) -> bytes:
    """The whole request body (the body-size limit around the app bounds it)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the body read before, then the connection's own messages (a disconnect)."""
    sent = False

    async def replaying() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replaying


def _called_tools(body: bytes) -> list[str]:
    """The tool names of the `tools/call` messages in a JSON-RPC body (one message or a batch)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return []  # the MCP server answers malformed JSON itself
    messages = parsed if isinstance(parsed, list) else [parsed]
    names = []
    for message in messages:
        if isinstance(message, dict) and message.get("method") == "tools/call":
            params = message.get("params")
            if isinstance(params, dict) and isinstance(params.get("name"), str):
                names.append(params["name"])
    return names
