"""Tool sessions over every protocol: the newest MCP protocol (no session id), the handshake-era one, and REST;
sessions belong to their token; refusals reach MCP clients as tool errors (docs/ARCHITECTURE.md#tool-sessions)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types.version import LATEST_HANDSHAKE_VERSION, LATEST_MODERN_VERSION

from rlctl.service.auth.scopes import Scope
from rlctl.service.auth.tokens import TokenStore
from rlctl.service.settings import Settings
from rlctl.service.tools.mcp_server import _tool_result
from tests.support import mcp_raw
from tests.support.live import LiveService, live_service
from tests.support.waiting import REQUEST_TIMEOUT, scaled, wait_until

ADMIN = "sessions-admin-token"


@dataclass
class Tokens:
    live: LiveService
    operate: str  # two tokens of the same scope, named t-a and t-b
    other: str
    read: str


@pytest.fixture
def tokens(make_settings: Callable[..., Settings]) -> Iterator[Tokens]:
    settings = make_settings(api_token=ADMIN, mcp_sessions_per_token=2)
    store = TokenStore(settings.tokens_path)
    made = (store.create("t-a", (Scope.OPERATE,)), store.create("t-b", (Scope.OPERATE,)))
    read = store.create("t-read", (Scope.READ,))
    with live_service(settings) as live:
        yield Tokens(live, *made, read)


async def mcp_calls(base_url: str, token: str, mode: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """The calls through the official SDK's client, negotiating as `mode` says: `auto` reaches the newest
    protocol, `legacy` the initialize handshake."""
    results = []
    async with (
        create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http,
        Client(streamable_http_client(f"{base_url}/mcp", http_client=http), mode=mode) as client,
    ):
        results.append(client.protocol_version)
        for name, arguments in calls:
            results.append(await client.call_tool(name, arguments))
    return results


def test_the_newest_protocol_keeps_the_selection_between_calls(tokens: Tokens) -> None:
    plan = [("rl_select_environment", {"name": "echo"}), ("rl_get_current_config", {})]
    version, selected, config = anyio.run(mcp_calls, tokens.live.base_url, tokens.operate, "auto", plan)
    assert version == LATEST_MODERN_VERSION  # no session id: the token's default session holds the state
    assert selected.is_error is False and config.is_error is False
    assert config.structured_content["environment"] == "echo"
    # the same token over REST, naming no session, sees it: one default session per token
    with tokens.live.client(token=tokens.operate) as client:
        answer = client.post("/tools/rl_get_current_config", json={})
        assert answer.json()["environment"] == "echo" and answer.headers["X-Tool-Session"] == "default"
    # another token's default session is its own
    with tokens.live.client(token=tokens.other) as client:
        assert "no environment selected" in client.post("/tools/rl_get_current_config", json={}).json()["error"]


def test_the_handshake_protocol_keeps_its_session_and_the_argument_names_one(tokens: Tokens) -> None:
    plan = [
        ("rl_select_environment", {"name": "gsm8k"}),
        ("rl_get_current_config", {}),
        ("rl_select_environment", {"name": "echo", "tool_session": "shared"}),
        ("rl_get_current_config", {"tool_session": "shared"}),
        ("rl_get_current_config", {"tool_session": "../bad"}),
    ]
    version, _, config, _, named, bad = anyio.run(mcp_calls, tokens.live.base_url, tokens.operate, "legacy", plan)
    assert version == LATEST_HANDSHAKE_VERSION
    assert config.structured_content["environment"] == "gsm8k"  # its MCP session's own tool session
    assert named.structured_content["environment"] == "echo"
    assert bad.is_error is True and bad.structured_content["argument"] == "tool_session"
    with tokens.live.client(token=tokens.operate) as client:
        # the argument wins over the header; the header over the default
        headers = {"X-Tool-Session": "shared"}
        assert client.post("/tools/rl_get_current_config", json={}, headers=headers).json()["environment"] == "echo"
        mine = client.post("/tools/rl_get_current_config", json={"tool_session": "elsewhere"}, headers=headers)
        assert "no environment selected" in mine.json()["error"] and mine.headers["X-Tool-Session"] == "elsewhere"
        assert "no environment selected" in client.post("/tools/rl_get_current_config", json={}).json()["error"]
    with tokens.live.client(token=tokens.other) as client:  # the same name under another token: another session
        named_elsewhere = client.post("/tools/rl_get_current_config", json={"tool_session": "shared"})
        assert "no environment selected" in named_elsewhere.json()["error"]


def test_an_mcp_session_belongs_to_its_token_and_each_token_holds_a_few(tokens: Tokens) -> None:
    with tokens.live.client(token=tokens.operate) as mine, tokens.live.client(token=tokens.other) as theirs:
        first = mcp_raw.open_session(mine)
        listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        assert mine.post("/mcp", content=json.dumps(listing), headers=first).status_code == 200
        stolen = theirs.post("/mcp", content=json.dumps(listing), headers=first)
        assert stolen.status_code == 404 and stolen.json()["error"]["code"] == "MCP_SESSION_NOT_FOUND"
        # the quota is 2 here: a third session ends the least recently used idle one (the first)
        second = mcp_raw.open_session(mine)
        third = mcp_raw.open_session(mine)
        ended = mine.post("/mcp", content=json.dumps(listing), headers=first)
        assert ended.status_code == 404 and ended.json()["error"]["code"] == "MCP_SESSION_NOT_FOUND"
        for live_one in (second, third):
            assert mine.post("/mcp", content=json.dumps(listing), headers=live_one).status_code == 200
        # another token's sessions are counted apart: its opening ends none of these
        mcp_raw.open_session(theirs)
        mcp_raw.open_session(theirs)
        assert mine.post("/mcp", content=json.dumps(listing), headers=second).status_code == 200


def test_refusals_reach_mcp_clients_as_tool_errors_with_stable_codes(tokens: Tokens) -> None:
    plan = [("rl_select_environment", {"name": "echo"}), ("rl_no_such_tool", {})]
    _, refused, unknown = anyio.run(mcp_calls, tokens.live.base_url, tokens.read, "auto", plan)
    assert refused.is_error is True and refused.structured_content["code"] == "INSUFFICIENT_SCOPE"
    assert unknown.is_error is True and unknown.structured_content["code"] == "TOOL_NOT_FOUND"
    available = set(unknown.structured_content["available"])
    assert "rl_list_runs" in available and "rl_select_environment" not in available  # only what it may call
    with tokens.live.client(token=tokens.read) as client:
        listed = client.get("/tools").json()["tools"]
        check_status = next(t for t in listed if t["function"]["name"] == "rl_check_status")
        assert "tool_session" not in check_status["function"]["parameters"]["properties"]  # reads no session
        metrics = client.get("/metrics").text
    # /mcp traffic has its route label, not "unmatched"
    assert 'route="/mcp"' in metrics and 'route="unmatched"' not in metrics


def test_mcp_annotations_and_schemas_say_what_the_tools_do(tokens: Tokens) -> None:
    async def listing(base_url: str) -> Any:
        async with (
            create_mcp_http_client(headers={"Authorization": f"Bearer {tokens.operate}"}) as http,
            Client(streamable_http_client(f"{base_url}/mcp", http_client=http)) as client,
        ):
            return (await client.list_tools()).tools

    by_name = {tool.name: tool for tool in anyio.run(listing, tokens.live.base_url)}
    check = by_name["rl_check_status"]
    assert check.annotations.read_only_hint is False  # a live check spends the run's allowance
    options = check.output_schema["anyOf"]
    assert any("rate_limited" in option["required"] for option in options if option["properties"]["rate_limited"])
    assert all("rate_limited" in option["required"] for option in options)
    # only the arguments without a default are required over MCP: openai-agents refuses a call missing a listed one
    select = by_name["rl_select_environment"].input_schema
    assert select["required"] == ["name"] and "tool_session" in select["properties"]
    assert by_name["rl_start_training"].input_schema["required"] == []


def test_rewards_weight_null_is_the_default_and_an_error_needs_a_value(tokens: Tokens) -> None:
    with tokens.live.client(token=tokens.operate) as client:
        arguments = {"run_id": "nosuch", "rewards": [{"name": "correctness", "weight": None}]}
        answer = client.post("/tools/rl_evaluate", json=arguments, timeout=REQUEST_TIMEOUT).json()
    assert answer["code"] == "RUN_NOT_FOUND", answer  # the arguments were accepted: null means the default weight
    # a result that holds "error": null is a success for MCP clients
    assert _tool_result({"evaluation_id": "e1", "error": None}).is_error is False
    assert _tool_result({"error": "no such run", "code": "RUN_NOT_FOUND"}).is_error is True


def test_with_every_session_busy_one_more_is_refused(tokens: Tokens) -> None:
    """Busy sessions are never ended for a new one: each of the two holds a request whose body is still coming."""
    release = threading.Event()
    started = threading.Semaphore(0)  # one release per request whose headers and first chunk were sent

    def slow_body() -> Iterator[bytes]:
        yield b'{"jsonrpc": "2.0", "id": 1, '
        started.release()
        release.wait(scaled(30))
        yield b'"method": "tools/list", "params": {}}'

    with tokens.live.client(token=tokens.operate) as mine:
        sessions = [mcp_raw.open_session(mine), mcp_raw.open_session(mine)]
        with ThreadPoolExecutor(2) as pool:
            pending = [pool.submit(mine.post, "/mcp", content=slow_body(), headers=h) for h in sessions]
            try:
                # A session is busy from its request's headers: an initialize before both are busy would end an
                # idle one of them (the quota's LRU eviction), so probe only once both requests are under way.
                assert all(started.acquire(timeout=scaled(30)) for _ in sessions)
                refused = wait_until(
                    lambda: (
                        (r := mine.post("/mcp", json=INITIALIZE, headers=mcp_raw.MCP_HEADERS)).status_code == 429 and r
                    ),
                    timeout=30,
                    message="a third session refused while both are busy",
                )
            finally:
                release.set()
            assert all(future.result().status_code == 200 for future in pending)
        assert refused.json()["error"]["code"] == "MCP_SESSION_QUOTA"
        opened = mine.post("/mcp", json=INITIALIZE, headers=mcp_raw.MCP_HEADERS)  # idle again: the LRU one ends
        assert opened.status_code == 200


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}},
}
