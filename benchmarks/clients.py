"""Every client on its first try: the plan select → configure → train → status → evaluate, per client.

The plan trains on a small scored dataset (select dataset_offline, set group_size and batch_size, start with the
dataset, check the status, evaluate the run against its base model).

Clients: the official `openai` SDK (a model that calls rlctl's tools; the model is a scripted OpenAI-compatible
server on loopback, standing in for a paid one, and the tool calls go to POST /tools without X-Tool-Session, as a
naive agent sends them), the `mcp` SDK negotiating the newest protocol (no session id), the `mcp` SDK with the
initialize handshake, a raw JSON-RPC client of an older protocol version (2025-03-26, as mcp 1.x clients speak it),
and the README's curl lines. Each runs the plan against one live service (local backend, tiny model); between
`status` and `evaluate` the harness waits for the run to end (a checkpoint is needed), outside the counted calls.

    .venv/bin/python benchmarks/clients.py

Prints, per client: completed, tool calls, errors seen, seconds, and seconds against the baseline measured in the
same run (REST naming its tool session, the one path that kept its state before issue 39). With a Python that has
openai-agents (a scratch venv over .venv: it is not a dependency of rlctl; tests/clients/agents.lock pins it), its
MCP client is measured too; with RLCTL_BENCH_MCP1_PYTHON naming a Python that has mcp==1.26.0 (hermes-agent's pin,
which cannot share a venv with rlctl's mcp 2.3; `make install-clients` builds one: .venv-clients/bin/python), the
previous major version of the mcp SDK too.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOKEN = "bench-clients-token"
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@dataclass
class Outcome:
    client: str
    calls: int = 0
    errors: list[str] = field(default_factory=list)
    completed: bool = False
    seconds: float = 0.0


DATASET = {"id": ""}  # the scored dataset each client trains on (made once, before the clients)
REPLIES = [("What is 2+3?", "5", "6"), ("What is 4+4?", "8", "9"), ("What is 3+3?", "6", "7")]


def plan(run_id: str | None) -> list[tuple[str, dict[str, Any]]]:
    """The plan's tool calls; the run id comes from rl_start_training's result. The run trains on a scored
    dataset (an evaluation compares the base and the checkpoints on a dataset run's held-out prompts)."""
    source = {"id": DATASET["id"], "mode": "offline", "held_out": 0.34}
    steps: list[tuple[str, dict[str, Any]]] = [
        ("rl_select_environment", {"name": "dataset_offline"}),
        ("rl_edit_config", {"field": "group_size", "value": 2}),
        ("rl_edit_config", {"field": "batch_size", "value": 4}),
        ("rl_start_training", {"backend": "local", "dataset": source}),
    ]
    if run_id is not None:
        steps += [
            ("rl_check_status", {"run_id": run_id}),
            # a null weight is the default weight (issue 39: it was refused)
            ("rl_evaluate", {"run_id": run_id, "rewards": [{"name": "correctness", "weight": None}]}),
        ]
    return steps


def scored_dataset(base_url: str) -> str:
    """The README's kind of upload: two replies per prompt and the answer; scored by correctness and format."""
    lines = [
        json.dumps({"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": r}], "answer": a})
        for q, a, wrong in REPLIES
        for r in (f"<think>{q}</think>{a}", wrong)
    ]
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as client:
        uploaded = client.post("/datasets", params={"name": "bench"}, content="\n".join(lines) + "\n").json()
        rewards = {"rewards": [{"name": "correctness"}, {"name": "format"}]}
        job = client.post(f"/datasets/{uploaded['id']}/score", json=rewards).json()
        while job["status"] not in ("succeeded", "failed", "cancelled"):
            time.sleep(0.5)
            job = client.get(f"/jobs/{job['id']}").json()
        return str(job["result"]["dataset_id"])


def wait_for_end(base_url: str, run_id: str, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as client:
        while time.monotonic() < deadline:
            status = client.get(f"/runs/{run_id}").json()["status"]
            if status in ("completed", "failed", "stopped"):
                return str(status)
            time.sleep(1)
    return "timeout"


def run_plan(outcome: Outcome, base_url: str, call: Callable[[str, dict[str, Any]], dict[str, Any]]) -> None:
    """The plan through `call` (one client's way of calling a tool), counting calls and errors."""
    started = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    run_id = None
    for name, arguments in plan(None):
        results[name] = _counted(outcome, name, call, arguments)
    run_id = results["rl_start_training"].get("run_id")
    if run_id is None:
        outcome.seconds = time.monotonic() - started
        return
    for name, arguments in plan(run_id)[len(plan(None)) :]:
        if name == "rl_evaluate":
            outcome.errors += [] if wait_for_end(base_url, run_id) == "completed" else ["the run did not complete"]
        results[name] = _counted(outcome, name, call, arguments)
    outcome.completed = not outcome.errors and bool(results["rl_evaluate"].get("id"))
    outcome.seconds = time.monotonic() - started


def _counted(
    outcome: Outcome, name: str, call: Callable[[str, dict[str, Any]], dict[str, Any]], arguments: dict[str, Any]
) -> dict[str, Any]:
    outcome.calls += 1
    try:
        result = call(name, arguments)
    except Exception as error:  # noqa: BLE001 - a client failure is a figure here
        outcome.errors.append(f"{name}: {type(error).__name__}: {error}")
        return {}
    if result.get("error") is not None or result.get("isError"):
        outcome.errors.append(f"{name}: {result.get('code')}: {result.get('error')}")
    return result


# --- the baseline: REST naming its session, the path that worked before issue 39 ---


def rest_named_session(base_url: str) -> Outcome:
    outcome = Outcome("baseline: REST with X-Tool-Session (worked before)")
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Tool-Session": "bench-baseline"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=60) as client:
        run_plan(outcome, base_url, lambda name, arguments: client.post(f"/tools/{name}", json=arguments).json())
    return outcome


# --- the openai SDK, with a scripted model ---


class ScriptedModel(BaseHTTPRequestHandler):
    """/v1/chat/completions that answers each turn with the plan's next tool call (as a model would)."""

    run_id: str | None = None

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        done = [m for m in body["messages"] if m["role"] == "tool"]
        for message in done:
            result = json.loads(message["content"])
            ScriptedModel.run_id = result.get("run_id", ScriptedModel.run_id)
        steps = plan(ScriptedModel.run_id)
        offered = {tool["function"]["name"] for tool in body.get("tools", [])}
        if len(done) < len(steps) and steps[len(done)][0] in offered:
            name, arguments = steps[len(done)]
            call = {
                "id": f"call_{len(done)}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
        else:
            message = {"role": "assistant", "content": "done"}
        answer = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls" if "tool_calls" in message else "stop"}
            ],
        }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: Any) -> None:
        pass


@contextmanager
def scripted_model() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedModel)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()


def openai_sdk(base_url: str) -> Outcome:
    from openai import OpenAI

    outcome = Outcome("openai SDK (tools over REST, no session header)")
    rest = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    tools = rest.get("/tools").json()["tools"]
    started = time.monotonic()
    with scripted_model() as model_url:
        ScriptedModel.run_id = None
        model = OpenAI(base_url=model_url, api_key="sk-scripted")
        messages: list[Any] = [{"role": "user", "content": "Train on my dataset, then evaluate the run."}]
        for _ in range(10):
            reply = model.chat.completions.create(model="scripted", messages=messages, tools=tools)
            message = reply.choices[0].message
            if not message.tool_calls:
                break
            messages.append(message.model_dump(exclude_none=True))
            for tool_call in message.tool_calls:
                name, arguments = tool_call.function.name, json.loads(tool_call.function.arguments)
                if name == "rl_evaluate":
                    run_id = arguments["run_id"]
                    outcome.errors += [] if wait_for_end(base_url, run_id) == "completed" else ["run not completed"]
                result = _counted(outcome, name, lambda n, a: rest.post(f"/tools/{n}", json=a).json(), arguments)
                if name == "rl_evaluate":
                    outcome.completed = not outcome.errors and bool(result.get("id"))
                messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": json.dumps(result)})
    outcome.seconds = time.monotonic() - started
    rest.close()
    return outcome


# --- the mcp SDK, newest protocol and handshake ---


def mcp_sdk(base_url: str, mode: str) -> Outcome:
    from mcp.client.client import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def main(outcome: Outcome) -> str:
        async with (
            create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"}) as http,
            Client(streamable_http_client(f"{base_url}/mcp", http_client=http), mode=mode) as client,
        ):
            loop = asyncio.get_running_loop()

            def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
                result = asyncio.run_coroutine_threadsafe(client.call_tool(name, arguments), loop).result()
                content = dict(result.structured_content or {})
                return {**content, "isError": result.is_error}

            await asyncio.to_thread(run_plan, outcome, base_url, call)
            return client.protocol_version

    outcome = Outcome(f"mcp SDK ({mode})")
    version = asyncio.run(main(outcome))
    outcome.client += f", protocol {version}"
    return outcome


def mcp_older(base_url: str, version: str = "2025-03-26") -> Outcome:
    """Raw JSON-RPC as an mcp 1.x client speaks it: initialize at an older version, then the session id."""
    outcome = Outcome(f"mcp raw JSON-RPC, protocol {version}")
    client = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    hello = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}},
    }
    opened = client.post("/mcp", json=hello, headers=MCP_HEADERS)
    headers = {**MCP_HEADERS, "Mcp-Session-Id": opened.headers["mcp-session-id"], "Mcp-Protocol-Version": version}
    client.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    ids = iter(range(1, 1000))

    def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        body = {
            "jsonrpc": "2.0",
            "id": next(ids),
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments},
        }
        answer = client.post("/mcp", json=body, headers=headers).json()
        if "error" in answer:
            raise RuntimeError(answer["error"])
        result = answer["result"]
        return {**(result.get("structuredContent") or {}), "isError": result.get("isError")}

    run_plan(outcome, base_url, call)
    client.close()
    return outcome


# --- openai-agents, with its default MCP client settings ---


def openai_agents(base_url: str) -> Outcome | None:
    """openai-agents' MCPServerStreamableHttp with default settings (what an Agent(mcp_servers=[...]) uses);
    None where openai-agents is not installed (it is not a dependency of rlctl: run this file with a Python
    that has it, e.g. a scratch venv over .venv)."""
    try:
        from agents.mcp import MCPServerStreamableHttp
    except ImportError:
        return None

    async def main(outcome: Outcome) -> None:
        params = {"url": f"{base_url}/mcp", "headers": {"Authorization": f"Bearer {TOKEN}"}}
        async with MCPServerStreamableHttp(params=params, name="rlctl") as server:  # type: ignore[arg-type]
            await server.list_tools()  # what an Agent does before its first turn
            loop = asyncio.get_running_loop()

            def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
                result = asyncio.run_coroutine_threadsafe(server.call_tool(name, arguments), loop).result()
                return {**(result.structured_content or {}), "isError": result.is_error}

            await asyncio.to_thread(run_plan, outcome, base_url, call)

    import importlib.metadata

    outcome = Outcome(f"openai-agents {importlib.metadata.version('openai-agents')} MCP (defaults)")
    asyncio.run(main(outcome))
    return outcome


# --- curl, as the README shows it ---


def curl_readme(base_url: str, workdir: Path) -> Outcome:
    outcome = Outcome("curl (README's lines, no session header)")
    host = base_url.removeprefix("http://")

    def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        done = subprocess.run(
            ["curl", "-sS", f"{host}/tools/{name}", "-H", f"Authorization: Bearer {TOKEN}",
             "-H", "Content-Type: application/json", "-d", json.dumps(arguments)],
            capture_output=True, text=True, check=True, cwd=workdir,
        )  # fmt: skip
        return dict(json.loads(done.stdout))

    run_plan(outcome, base_url, call)
    return outcome


# --- mcp 1.x (hermes-agent's MCP client), from a Python that has it ---


def mcp1_in_this_python(base_url: str) -> Outcome:
    """The plan through the mcp 1.x SDK (hermes-agent pins mcp==1.26.0, which cannot live beside rlctl's mcp 2.3):
    run by `clients.py --mcp1 URL DATASET` under a Python that has it; prints the outcome as JSON."""
    from mcp import ClientSession  # the 1.x API
    from mcp.client.streamable_http import streamablehttp_client

    async def main(outcome: Outcome) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            streamablehttp_client(f"{base_url}/mcp", headers=headers) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            hello = await session.initialize()
            outcome.client += f", protocol {hello.protocolVersion}"
            loop = asyncio.get_running_loop()

            def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
                result = asyncio.run_coroutine_threadsafe(session.call_tool(name, arguments), loop).result()
                return {**(result.structuredContent or {}), "isError": result.isError}

            await asyncio.to_thread(run_plan, outcome, base_url, call)

    import importlib.metadata

    outcome = Outcome(f"mcp {importlib.metadata.version('mcp')} SDK (hermes-agent's)")
    asyncio.run(main(outcome))
    return outcome


def mcp1(base_url: str, python: str | None) -> Outcome | None:
    if not python:
        return None
    done = subprocess.run(
        [python, __file__, "--mcp1", base_url, DATASET["id"]], capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        return Outcome(f"mcp 1.x ({python})", errors=[done.stderr[-300:]])
    return Outcome(**json.loads(done.stdout.splitlines()[-1]))


def main() -> None:
    if sys.argv[1:2] == ["--mcp1"]:
        DATASET["id"] = sys.argv[3]
        print(json.dumps(mcp1_in_this_python(sys.argv[2]).__dict__))
        return
    from tests.conftest import build_settings
    from tests.support.live import live_service
    from tests.support.tiny_model import keep_session_models_in

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        keep_session_models_in(root / "models")

        settings = build_settings(
            root / "var",
            f"sqlite:///{root}/bench.db",
            api_token=TOKEN,
            local_total_steps=4,
            local_save_checkpoint_interval=2,
            stop_grace_s=5.0,
        )
        with live_service(settings) as live:
            DATASET["id"] = scored_dataset(live.base_url)
            rest_named_session(live.base_url)  # warm-up: the first run starts the fork server, loads the model
            baseline = rest_named_session(live.base_url)
            outcomes = [
                openai_sdk(live.base_url),
                mcp_sdk(live.base_url, "auto"),
                mcp_sdk(live.base_url, "legacy"),
                mcp_older(live.base_url),
                curl_readme(live.base_url, root),
            ]
            agents = openai_agents(live.base_url)
            outcomes += [agents] if agents is not None else []
            old_sdk = mcp1(live.base_url, os.environ.get("RLCTL_BENCH_MCP1_PYTHON"))
            outcomes += [old_sdk] if old_sdk is not None else []
    print(f"{'client':62} {'completed':>9} {'calls':>5} {'errors':>6} {'seconds':>8} {'vs baseline':>11}")
    for outcome in [baseline, *outcomes]:
        figures = f"{outcome.completed!s:>9} {outcome.calls:>5} {len(outcome.errors):>6} {outcome.seconds:>8.1f}"
        print(f"{outcome.client:62} {figures} {outcome.seconds / baseline.seconds:>10.2f}x")
        for error in outcome.errors:
            print(f"    {error[:160]}")
    print(f"all completed: {all(o.completed for o in outcomes)}; errors: {sum(len(o.errors) for o in outcomes)}")
    if agents is None:
        print("openai-agents: not installed here (run with a Python that has openai-agents==0.24.0 to include it)")
    if old_sdk is None:
        print("mcp 1.x: set RLCTL_BENCH_MCP1_PYTHON to a Python with mcp==1.26.0 (hermes-agent's) to include it")


if __name__ == "__main__":
    main()
