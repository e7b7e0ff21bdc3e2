"""The same tools through a real MCP client (the official SDK's streamable-HTTP client) against /mcp."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from rlctl.service.settings import Settings
from tests.support.live import live_service
from tests.support.waiting import REQUEST_TIMEOUT

TOKEN = "mcp-test-token"


class Agent:
    """One MCP client session, with the bearer token and an rlctl tool session header."""

    def __init__(self, session: ClientSession) -> None:
        self.session = session

    async def call(self, tool: str, **arguments: Any) -> dict:
        result = await self.session.call_tool(tool, arguments)
        assert result.structured_content is not None
        return result.structured_content


async def with_agent(base_url: str, work: Callable[[Agent], Any], tool_session: str | None = "mcp", token: str = TOKEN):
    headers = {"Authorization": f"Bearer {token}"}
    if tool_session is not None:
        headers["X-Tool-Session"] = tool_session
    async with (
        create_mcp_http_client(headers=headers) as http_client,
        streamable_http_client(f"{base_url}/mcp", http_client=http_client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        return await work(Agent(session))


def test_tools_are_listed_with_schemas_and_hints(make_settings: Callable[..., Settings]) -> None:
    async def work(agent: Agent) -> list:
        return (await agent.session.list_tools()).tools

    with live_service(make_settings(api_token=TOKEN)) as live:
        tools = anyio.run(with_agent, live.base_url, work)
    by_name = {tool.name: tool for tool in tools}
    assert len(by_name) >= 9
    assert by_name["rl_list_environments"].annotations.read_only_hint is True
    assert by_name["rl_stop_training"].annotations.destructive_hint is True
    assert by_name["rl_edit_config"].annotations.idempotent_hint is True
    assert by_name["rl_start_training"].annotations.read_only_hint is False
    assert by_name["rl_check_status"].input_schema["required"] == ["run_id"]
    assert by_name["rl_check_status"].output_schema["type"] == "object"
    assert "30 minutes" in by_name["rl_check_status"].description


def test_mcp_needs_the_token(make_settings: Callable[..., Settings]) -> None:
    with live_service(make_settings(api_token=TOKEN)) as live:
        response = httpx.post(
            f"{live.base_url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=REQUEST_TIMEOUT
        )
        assert response.status_code == 401 and response.json()["error"]["code"] == "UNAUTHORIZED"
        with pytest.raises(BaseException):  # noqa: B017 - the SDK wraps the 401 in its own exception groups
            anyio.run(with_agent, live.base_url, lambda agent: agent.call("rl_list_runs"), "mcp", "wrong")


@pytest.mark.e2e
def test_the_agent_workflow_over_mcp(run_settings: Callable[..., Settings]) -> None:
    async def work(agent: Agent) -> None:
        assert "echo" in {e["name"] for e in (await agent.call("rl_list_environments"))["environments"]}
        assert (await agent.call("rl_select_environment", name="echo"))["environment"] == "echo"
        config = await agent.call("rl_get_current_config")
        assert {f["name"] for f in config["locked_fields"]} >= {"total_steps", "learning_rate"}
        assert (await agent.call("rl_edit_config", field="group_size", value=4))["config"] == {"group_size": 4}
        await agent.call("rl_edit_config", field="batch_size", value=16)
        locked = await agent.call("rl_edit_config", field="learning_rate", value=0.5)
        assert locked["code"] == "FIELD_LOCKED" and "locked_value" in locked
        started = await agent.call("rl_start_training", backend="local")
        run_id = started["run_id"]
        with anyio.fail_after(240):
            while (await agent.call("rl_list_runs", status="running"))["count"] == 0:
                await anyio.sleep(0.5)
        first = await agent.call("rl_check_status", run_id=run_id)
        assert first["status"] == "running"
        second = await agent.call("rl_check_status", run_id=run_id)
        assert second["rate_limited"] is True
        assert (await agent.call("rl_stop_training", run_id=run_id))["status"] == "stopped"
        assert (await agent.call("rl_get_results", run_id=run_id))["status"] == "stopped"
        unknown = await agent.session.call_tool("rl_no_such_tool", {})
        assert unknown.is_error is True and unknown.structured_content["code"] == "TOOL_NOT_FOUND"

    with live_service(run_settings(api_token=TOKEN, local_total_steps=10_000)) as live:
        anyio.run(with_agent, live.base_url, work)


def test_each_mcp_session_has_its_own_tool_session(make_settings: Callable[..., Settings]) -> None:
    """Without X-Tool-Session, an MCP client's calls share its MCP session's tool session, and no other's."""

    async def select_then_read(agent: Agent) -> dict:
        await agent.call("rl_select_environment", name="gsm8k")
        return await agent.call("rl_get_current_config")

    async def read(agent: Agent) -> dict:
        return await agent.call("rl_get_current_config")

    with live_service(make_settings(api_token=TOKEN)) as live:
        mine = anyio.run(with_agent, live.base_url, select_then_read, None)
        other = anyio.run(with_agent, live.base_url, read, None)
        named = anyio.run(with_agent, live.base_url, read, "default")
    assert mine["environment"] == "gsm8k"
    assert "no environment selected" in other["error"]
    assert "no environment selected" in named["error"]  # nothing leaked into the default session either
