"""The same tools over MCP (streamable HTTP at /mcp), through the official SDK, behind the same tokens and scopes.

Tools are listed with their input and output schemas and read-only / destructive / idempotent hints; a call
runs the one implementation in rlctl/service/tools/service.py, in the token's tool session named by the tool's
`tool_session` argument, X-Tool-Session, the MCP session (handshake-era clients), else `default`: the newest
protocol has no sessions (docs/ARCHITECTURE.md#tool-sessions). An MCP session belongs to the token that opened it,
and each token holds at most `mcp_sessions_per_token` of them.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import Message, Receive, Scope, Send

from rlctl.service.auth.guard import identify, is_open
from rlctl.service.auth.tokens import Principal
from rlctl.service.context import AppContext
from rlctl.service.errors import ServiceError
from rlctl.service.http import error_response
from rlctl.service.runs.ratelimit import describe_interval
from rlctl.service.settings import Settings
from rlctl.service.tools import service
from rlctl.service.tools.registry import Tool


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


class McpSessionNotFound(ServiceError):
    status_code = 404
    code = "MCP_SESSION_NOT_FOUND"

    def __init__(self) -> None:
        # The same answer for an unknown, ended or another token's session: nothing tells them apart.
        super().__init__("no such MCP session for this token: initialize a new one")


class McpSessionQuota(ServiceError):
    status_code = 429
    code = "MCP_SESSION_QUOTA"

    def __init__(self, quota: int) -> None:
        super().__init__(
            f"this token already has {quota} MCP sessions, all busy: end one (DELETE /mcp) or retry when one is idle",
            {"limit": quota},
        )


@dataclass
class _Owned:
    token: str  # the name of the token that opened the session
    last_used: float
    in_flight: int = 0


class McpSessions:
    """The MCP sessions' owners and the per-token quota, over the SDK's session manager (whose own limit is
    global: one token could fill it for everyone)."""

    def __init__(self, manager: StreamableHTTPSessionManager, quota: int) -> None:
        self.manager = manager
        self.quota = quota
        self._owned: dict[str, _Owned] = {}
        self._opening = defaultdict[str, anyio.Lock](anyio.Lock)  # one opening at a time per token

    def _alive(self) -> dict[str, Any]:
        # The SDK 2.3 keeps its open sessions here; it offers no public view of them.
        return self.manager._server_instances  # noqa: SLF001

    def _forget_ended(self) -> None:
        alive = self._alive()
        for session_id in [sid for sid in self._owned if sid not in alive]:
            del self._owned[session_id]

    def owned_by(self, token: str) -> list[str]:
        self._forget_ended()
        return [sid for sid, owned in self._owned.items() if owned.token == token]

    @asynccontextmanager
    async def using(self, session_id: str, token: str) -> AsyncIterator[None]:
        """A request in `session_id`: 404 unless `token` opened it and it is still open."""
        owned = self._owned.get(session_id)
        if owned is None or owned.token != token or session_id not in self._alive():
            raise McpSessionNotFound()
        owned.in_flight += 1
        try:
            yield
        finally:
            owned.in_flight -= 1
            owned.last_used = time.monotonic()

    @asynccontextmanager
    async def opening(self, token: str) -> AsyncIterator[dict[str, str]]:
        """Room for one more of `token`'s sessions (its least recently used idle one ends at the quota); the
        caller puts the new session's id under "id" in the dict it gets."""
        async with self._opening[token]:
            mine = self.owned_by(token)
            if len(mine) >= self.quota:
                idle = [sid for sid in mine if self._owned[sid].in_flight == 0]
                if not idle:
                    raise McpSessionQuota(self.quota)
                await self._end(min(idle, key=lambda sid: self._owned[sid].last_used))
            opened: dict[str, str] = {}
            yield opened
            if opened.get("id") in self._alive():
                self._owned[opened["id"]] = _Owned(token, time.monotonic())

    async def _end(self, session_id: str) -> None:
        transport = self._alive().get(session_id)
        self._owned.pop(session_id, None)
        if transport is not None:
            await self.manager._discard_session(session_id, transport)  # noqa: SLF001 - no public way in 2.3


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
        self.sessions = McpSessions(self.manager, ctx.settings.mcp_sessions_per_token)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.manager.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            principal = identify(self.ctx.settings, self.ctx.tokens, _header(scope, b"authorization"))
            remember_in_scope(scope, principal)
            if scope.get("method") == "GET":
                # The server never sends a message of its own, so a GET event stream would only stay open (300
                # idle streams held 339 descriptors). MCP lets a server without one answer 405.
                raise NoEventStream()
            session_id = _header(scope, MCP_SESSION_ID_HEADER.encode())
            if session_id is not None:
                async with self.sessions.using(session_id, principal.name):
                    await self._app(scope, receive, send)
                return
            body = await _read_body(receive)
            receive = _replay(body, receive)
            if not _opens_a_session(scope, body):
                await self._app(scope, receive, send)
                return
            async with self.sessions.opening(principal.name) as opened:
                await self._app(scope, receive, _noting_session_id(send, opened))
        except ServiceError as error:
            await error_response(error)(scope, receive, send)

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
        except ServiceError as exc:  # an unknown tool, a missing scope, a bad X-Tool-Session: a tool error
            return _tool_result({"error": exc.message, "code": exc.code, **exc.details})
        return _tool_result(call.result)


def _tool_result(result: dict[str, Any]) -> types.CallToolResult:
    """A tool's result; an error only when its `error` is set (a result may hold `"error": null`)."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(result))],
        structured_content=result,
        is_error=result.get("error") is not None,
    )


def mcp_tool(tool: Tool[Any], settings: Settings) -> types.Tool:
    return types.Tool(
        name=tool.name,
        description=tool.describe(settings),
        input_schema=tool.mcp_input_schema,
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


def _opens_a_session(scope: Scope, body: bytes) -> bool:
    """A handshake-era `initialize` (the newest protocol, named in its version header, has no sessions)."""
    version = _header(scope, MCP_PROTOCOL_VERSION_HEADER.encode())
    if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return False
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return False  # the MCP server answers malformed JSON itself
    return isinstance(parsed, dict) and parsed.get("method") == "initialize"


def _noting_session_id(send: Send, opened: dict[str, str]) -> Send:
    """A send that notes the session id the SDK's answer carries."""
    header = MCP_SESSION_ID_HEADER.encode()

    async def noting(message: Message) -> None:
        if message["type"] == "http.response.start":
            for name, value in message.get("headers", []):
                if name.lower() == header:
                    opened["id"] = value.decode("latin-1")
        await send(message)

    return noting
