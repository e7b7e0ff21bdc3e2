"""A third-party MCP client's plan against a live rlctl: select → configure → get config, one client per run.

Run by tests/tools/test_clients.py under a side environment's Python (`make test` builds them from the locks in
this folder), since these clients cannot share rlctl's environment: hermes-agent pins mcp==1.26.0 (rlctl has mcp
2.x) and openai==2.24.0, openai-agents wants websockets<17 (rlctl's test extra has 17). It imports no rlctl code.

    python tests/clients/plan.py CLIENT URL    (CLIENT: mcp1, hermes or agents; the token in RLCTL_CLIENT_TOKEN)

Prints one JSON line: the client, the protocol version it negotiated where it says, and each call's structured
result with its isError flag.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import sys
from typing import Any

CALLS: list[tuple[str, dict[str, Any]]] = [
    ("rl_select_environment", {"name": "echo"}),
    ("rl_edit_config", {"field": "group_size", "value": 4}),
    ("rl_get_current_config", {}),
]


async def with_mcp1(url: str, token: str) -> dict[str, Any]:
    """The previous major version of the `mcp` SDK (1.x), its streamable-HTTP client and ClientSession."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async with (
        streamablehttp_client(f"{url}/mcp", headers={"Authorization": f"Bearer {token}"}) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        hello = await session.initialize()
        results = []
        for name, arguments in CALLS:
            result = await session.call_tool(name, arguments)
            results.append({**(result.structuredContent or {}), "isError": result.isError})
    return {"client": f"mcp {importlib.metadata.version('mcp')}", "protocol": hello.protocolVersion, "results": results}


async def with_agents(url: str, token: str) -> dict[str, Any]:
    """openai-agents' own MCP client with its default settings (what Agent(mcp_servers=[...]) uses)."""
    from agents.mcp import MCPServerStreamableHttp

    params = {"url": f"{url}/mcp", "headers": {"Authorization": f"Bearer {token}"}}
    async with MCPServerStreamableHttp(params=params, name="rlctl") as server:  # type: ignore[arg-type]
        await server.list_tools()  # what an Agent does before its first turn
        results = []
        for name, arguments in CALLS:
            result = await server.call_tool(name, arguments)
            results.append({**(result.structured_content or {}), "isError": result.is_error})
    versions = f"openai-agents {importlib.metadata.version('openai-agents')}, mcp {importlib.metadata.version('mcp')}"
    return {"client": versions, "protocol": None, "results": results}


def with_hermes(url: str, token: str) -> dict[str, Any]:
    """hermes-agent's own MCP tool client: its config's server entry registers rlctl's tools in hermes' registry
    (on its background loop, with mcp 1.x underneath), and each call is dispatched as the agent loop does it."""
    from tools.mcp_tool import register_mcp_servers
    from tools.registry import registry

    registered = register_mcp_servers({"rlctl": {"url": f"{url}/mcp", "headers": {"Authorization": f"Bearer {token}"}}})
    results = []
    for name, arguments in CALLS:
        answer = json.loads(str(registry.dispatch(f"mcp__rlctl__{name}", arguments)))
        # hermes gives the model the tool's text under "result", or "error" when the tool said isError
        results.append(
            {**json.loads(answer["result"]), "isError": False} if "result" in answer else {**answer, "isError": True}
        )
    return {
        "client": f"hermes-agent {importlib.metadata.version('hermes-agent')}, mcp {importlib.metadata.version('mcp')}",
        "protocol": None,
        "registered": len([n for n in registered if n.startswith("mcp__rlctl__")]),
        "results": results,
    }


def main() -> None:
    client, url = sys.argv[1], sys.argv[2]
    token = os.environ["RLCTL_CLIENT_TOKEN"]
    if client == "hermes":
        print(json.dumps(with_hermes(url, token)))
        return
    run = {"mcp1": with_mcp1, "agents": with_agents}[client]
    print(json.dumps(asyncio.run(run(url, token))))


if __name__ == "__main__":
    main()
