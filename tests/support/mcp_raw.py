"""Raw MCP over HTTP for tests that speak JSON-RPC themselves: the endpoint is stateful (each client session
has an id, and its own tool session: docs/ARCHITECTURE.md#tool-sessions), so a call first opens a session."""

from __future__ import annotations

import json
from typing import Any

import httpx

MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def open_session(client: httpx.Client) -> dict[str, str]:
    """initialize + notifications/initialized; the headers that carry the session on later calls."""
    response = _initialize(client)
    response.raise_for_status()
    headers = {**MCP_HEADERS, "Mcp-Session-Id": response.headers["mcp-session-id"]}
    if "mcp-protocol-version" in response.headers:
        headers["Mcp-Protocol-Version"] = response.headers["mcp-protocol-version"]
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    client.post("/mcp", content=json.dumps(initialized), headers=headers).raise_for_status()
    return headers


def _initialize(client: httpx.Client) -> httpx.Response:
    hello = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}},
    }
    return client.post("/mcp", content=json.dumps(hello), headers=MCP_HEADERS)


def call(client: httpx.Client, method: str, params: dict[str, Any]) -> httpx.Response:
    """One JSON-RPC request in a session of its own; a refused initialize (no token) is the answer."""
    refused = _initialize(client)
    if refused.status_code != 200:
        return refused
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return client.post("/mcp", content=json.dumps(body), headers=open_session(client))
