"""The sandbox's network (only the destinations a collection names), its memory cap and its seccomp filter,
each tried with real commands in the real sandbox (bubblewrap) against real loopback HTTP servers."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from rlctl.sandbox.bubblewrap import Sandbox
from rlctl.sandbox.netgate import NetworkPolicy, parse_allowed_ranges, parse_destination
from rlctl.sandbox.seccomp import native_arch
from rlctl.sandbox.toolbox import TOOL_NAMES, Toolbox
from rlctl.service.settings import Settings
from tests.datasets_api.chat_server import chat_server
from tests.support.live import in_process_service
from tests.support.waiting import wait_until

LOOPBACK = parse_allowed_ranges("127.0.0.0/8")


@dataclass
class Site:
    port: int
    paths: list[str] = field(default_factory=list)


@contextmanager
def site() -> Iterator[Site]:
    """A loopback HTTP server that answers `hello <path>` and records each path it is asked for."""
    state = Site(0)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            state.paths.append(self.path)
            body = f"hello {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def named() -> Iterator[Site]:
    with site() as server:
        yield server


@pytest.fixture
def unnamed() -> Iterator[Site]:
    with site() as server:
        yield server


_made: list[Toolbox] = []


@pytest.fixture(autouse=True)
def _close_toolboxes() -> Iterator[None]:
    """Each toolbox keeps its item's sandbox (a tmpfs's keeper process): ended with its test, even a failing one."""
    yield
    while _made:
        _made.pop().close()


def toolbox_for(tmp_path: Path, sandbox: Sandbox, network: NetworkPolicy | None, name: str = "work") -> Toolbox:
    work = tmp_path / name
    work.mkdir()
    made = Toolbox(list(TOOL_NAMES), work, timeout_s=20.0, output_limit=8000, sandbox=sandbox, network=network)
    _made.append(made)
    return made


def run(toolbox: Toolbox, command: str) -> dict[str, Any]:
    return json.loads(toolbox.call("terminal", {"command": command}))


def test_only_the_named_destination_is_reachable(tmp_path: Path, sandbox: Sandbox, named: Site, unnamed: Site) -> None:
    policy = NetworkPolicy((parse_destination(f"127.0.0.1:{named.port}"),), LOOPBACK)
    toolbox = toolbox_for(tmp_path, sandbox, policy)
    result = run(
        toolbox,
        f"curl -sSf -m 10 http://127.0.0.1:{named.port}/proxied; echo; "  # through http_proxy
        f"curl -sSf -m 10 --noproxy '*' http://127.0.0.1:{named.port}/direct; echo; "  # the relay's own port
        f"curl -sSf -m 10 --proxytunnel http://127.0.0.1:{named.port}/tunnel; echo; "  # CONNECT, as for https
        f"python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:{named.port}/py\").read())'; "
        f"curl -sSf -m 10 http://127.0.0.1:{unnamed.port}/proxied; echo proxied-other=$?; "
        f"curl -sSf -m 10 --noproxy '*' http://127.0.0.1:{unnamed.port}/direct; echo direct-other=$?; "
        f"(exec 3<>/dev/tcp/127.0.0.1/{unnamed.port}) 2>/dev/null; echo tcp-other=$?",
    )
    output = result["output"]
    assert all(f"hello /{path}" in output for path in ("proxied", "direct", "tunnel", "py")), result
    assert "proxied-other=22" in output  # 403 from the gate (curl -f: 22)
    assert "direct-other=7" in output and "tcp-other=1" in output  # nothing listens for it in the sandbox
    assert result["network_refused"] == [f"127.0.0.1:{unnamed.port}"]
    assert named.paths == ["/proxied", "/direct", "/tunnel", "/py"] and unnamed.paths == []


def test_no_network_unless_destinations_are_named(tmp_path: Path, sandbox: Sandbox, named: Site) -> None:
    toolbox = toolbox_for(tmp_path, sandbox, None)
    result = run(
        toolbox,
        f"env | grep -ci proxy; curl -sS -m 5 http://127.0.0.1:{named.port}/x; echo curl=$?; "
        "ls /run/rlctl-net 2>&1 | head -1",
    )
    assert result["output"].startswith("0\n") and "curl=7" in result["output"], result
    assert "No such file" in result["output"] and named.paths == []


def test_a_name_resolving_to_a_refused_address_gets_nowhere(tmp_path: Path, sandbox: Sandbox, named: Site) -> None:
    # The collection names a host; the gate resolves it outside the sandbox, at each connection, and refuses a
    # loopback address the server does not allow (as DNS rebinding would make of an innocent-looking name).
    policy = NetworkPolicy((parse_destination(f"localhost:{named.port}"),), allowed_ranges=())
    toolbox = toolbox_for(tmp_path, sandbox, policy)
    result = run(
        toolbox,
        f"curl -sS -m 10 http://localhost:{named.port}/x; echo; curl -sSf -m 10 --noproxy '*' "
        f"http://localhost:{named.port}/y; echo direct=$?",
    )
    assert "loopback address, reachable only where RLCTL_SANDBOX_NETWORK_ALLOW" in result["output"], result
    assert "direct=56" in result["output"] or "direct=52" in result["output"]  # the relay's port, closed by the gate
    assert named.paths == []


def test_the_memory_limit_ends_only_the_call_that_reached_it(tmp_path: Path, sandbox: Sandbox) -> None:
    small = replace(sandbox, limits=replace(sandbox.limits, memory_bytes=96 << 20, address_space_bytes=4 << 30))
    greedy = toolbox_for(tmp_path, small, None, "greedy")
    neighbour = toolbox_for(tmp_path, sandbox, None, "neighbour")
    beside: dict[str, Any] = {}
    started = threading.Thread(target=lambda: beside.update(run(neighbour, "sleep 1; echo still here")))
    started.start()
    # 300 MB in one process, then 8 processes of 20 MB: both over 96 MiB (an address-space rlimit stops neither).
    result = run(greedy, "python3 -c 'b = bytearray(300 << 20); print(len(b))'; echo one=$?")
    several = run(
        greedy,
        "for i in 1 2 3 4 5 6 7 8; do python3 -c 'import time; b = bytearray(20 << 20); "
        "time.sleep(2)' & done; wait; echo several=$?",
    )
    started.join(timeout=60)
    if sandbox.memory_mode == "rlimit":  # no memory cgroup here: only the per-process limit (docs/SECURITY.md)
        pytest.skip("no memory cgroup can be made here: the call-wide memory limit does not apply")
    assert "one=137" in result["output"] and "memory limit of 100663296 bytes" in result["error"], result
    assert "Killed" in several["output"] and "memory limit" in several["error"], several
    assert beside["output"] == "still here\n" and "error" not in beside
    assert run(greedy, "echo next call")["output"] == "next call\n"  # the item goes on with its next call


def test_seccomp_blocks_kernel_surfaces_with_eperm(tmp_path: Path, sandbox: Sandbox) -> None:
    arch = native_arch()
    assert arch is not None
    numbers = arch.numbers
    probe = (
        "import ctypes, os, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def call(name, nr, *args):\n"
        "    result = libc.syscall(nr, *args)\n"
        "    print(name, result, ctypes.get_errno())\n"
        f"call('ptrace', {numbers['ptrace']}, 0, 0, 0, 0)\n"
        f"call('keyctl', {numbers['keyctl']}, 0, -3, 0)\n"
        f"call('bpf', {numbers['bpf']}, 0, 0, 0)\n"
        f"call('perf_event_open', {numbers['perf_event_open']}, 0, 0, -1, -1, 0)\n"
        f"call('clone_newnet', {numbers['clone']}, 0x40000000 | 17, 0, 0, 0, 0)\n"
        "thread = threading.Thread(target=print, args=('thread', 'ok'))\n"
        "thread.start(); thread.join()\n"
        "pid = os.fork()\n"
        "os._exit(0) if pid == 0 else print('fork', os.waitpid(pid, 0)[1])\n"
    )
    toolbox = toolbox_for(tmp_path, sandbox, None)
    toolbox.workdir.write("probe.py", probe.encode())
    result = run(toolbox, "grep Seccomp: /proc/self/status; python3 probe.py; unshare --mount true; echo u=$?")
    lines = result["output"].splitlines()
    assert "Seccomp:\t2" in lines, result  # filter mode
    for name in ("ptrace", "keyctl", "bpf", "perf_event_open", "clone_newnet"):
        assert f"{name} -1 1" in lines, (name, result)  # -1, errno 1 = EPERM
    assert "thread ok" in lines and "fork 0" in lines
    assert "Operation not permitted" in result["output"] and "u=1" in lines


def test_a_collection_reaches_what_it_names_through_the_service(
    make_settings: Callable[..., Settings], sandbox: Sandbox, named: Site, unnamed: Site
) -> None:
    # A scripted agent model (the tiny model never calls tools) asks `terminal` for both servers.
    command = (
        f"curl -sSf -m 10 http://127.0.0.1:{named.port}/named; echo; "
        f"curl -sSf -m 10 http://127.0.0.1:{unnamed.port}/unnamed; echo other=$?"
    )

    def agent(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if any(message["role"] == "tool" for message in body["messages"]):
            return 200, {"content": "<think>done</think>done"}
        call = {
            "id": "a",
            "type": "function",
            "function": {"name": "terminal", "arguments": json.dumps({"command": command})},
        }
        return 200, {"content": "", "tool_calls": [call]}

    body: dict[str, Any] = {
        "name": "networked",
        "prompts": [{"prompt": "Fetch it."}],
        "base_url": "",
        "model": "scripted",
        "runs_per_prompt": 2,
        "max_turns": 3,
        "tools": ["terminal"],
        "network": [f"127.0.0.1:{named.port}"],
    }
    with chat_server(agent) as model:
        body["base_url"] = model.base_url
        strict = make_settings()
        with in_process_service(strict) as live, live.client() as client:
            refused = client.post("/collections", json=body)
            assert refused.status_code == 422 and refused.json()["error"]["code"] == "NETWORK_DESTINATION_FORBIDDEN"
            by_tool = client.post("/tools/rl_collect_trajectories", json=body)  # the agent tools' same model
            assert by_tool.json()["code"] == "NETWORK_DESTINATION_FORBIDDEN", by_tool.text
            for bad, kind in ((["nohost"], "network_destination_invalid"), (["[::1]"], "network_destination_invalid")):
                answer = client.post("/collections", json={**body, "network": bad})
                assert answer.status_code == 422 and answer.json()["error"]["details"]["errors"][0]["type"] == kind
            without = client.post("/collections", json={**body, "tools": ["read_file"]})
            assert without.json()["error"]["details"]["errors"][0]["type"] == "network_without_terminal"
            assert client.get("/collections").json()["count"] == 0
        allowing = make_settings(sandbox_network_allow="127.0.0.1/32")
        with in_process_service(allowing) as live, live.client() as client:
            created = client.post("/collections", json=body)
            assert created.status_code == 202, created.text
            collection_id = created.json()["id"]
            done = wait_until(
                lambda: (
                    (c := client.get(f"/collections/{collection_id}").json())["status"] != "running"
                    and c["status"] != "queued"
                    and c
                ),
                timeout=60,
                message="the collection ends",
            )
            assert done["status"] == "completed", done
            assert done["params"]["network"] == [f"127.0.0.1:{named.port}"]
            page = client.get(f"/datasets/{done['dataset_id']}/records")
            assert page.status_code == 200, (page.status_code, page.text[:2000], done)  # seen once in CI: not 200
            records = page.json()["records"]
    outputs = [turn["value"] for record in records for turn in record["conversations"] if turn.get("name")]
    assert len(outputs) == 2 and all("hello /named" in o and "other=22" in o for o in outputs), outputs
    assert named.paths == ["/named", "/named"] and unnamed.paths == []
