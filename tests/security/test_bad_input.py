"""Bad input answered with a 4xx and a stable code, never a 500, and nothing stored; reproductions of the
cases found by attacking the service (each once answered 500, hung, or forged a log line)."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from rlctl.service.collections.service import chat_api_key
from rlctl.service.datasets.uploads import MAX_ITEM_BYTES
from rlctl.service.inference_tests.summary import result_file_stem
from rlctl.service.observability import SecretScrubber
from rlctl.service.settings import Settings
from rlctl.trajectories.reading import MAX_NESTING
from tests.support.live import LiveService, live_service
from tests.support.service_process import service_process
from tests.support.waiting import REQUEST_TIMEOUT, scaled, wait_until

GOOD = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}


def _record(**extra: Any) -> bytes:
    return json.dumps({**GOOD, **extra}).encode()


def test_unstorable_uploads_are_refused_by_line(service: LiveService) -> None:
    deep: Any = "leaf"
    for _ in range(MAX_NESTING + 200):
        deep = {"k": deep}
    cases = {
        "surrogate": _record() + b"\n" + b'{"messages": [{"role": "user", "content": "\\ud800"}]}\n',
        "deep": _record() + b"\n" + _record(meta=deep) + b"\n",
        "very deep": _record() + b"\n" + b"[" * 100_000 + b"]" * 100_000 + b"\n",
        "deep document": b"[" + _record() + b"," + _record(meta=deep) + b"]",
        # One line nested 1,000 deep as the first one: guessing the container parsed it and raised (a 500).
        "deep first line": b"[" * 1000 + b"]" * 1000 + b"\n" + _record() + b"\n",
        "deep first object": b'{"a":' * 1000 + b"1" + b"}" * 1000 + b"\n" + _record() + b"\n",
    }
    with service.client() as client:
        for name, body in cases.items():
            refused = client.post("/datasets", params={"name": "bad"}, content=body)
            assert refused.status_code == 422, (name, refused.text)
            errors = refused.json()["error"]["details"]["errors"]
            assert [e["line"] for e in errors] in ([2], [1]), (name, errors)
        assert client.get("/datasets").json()["count"] == 0
        kept = client.post("/datasets", params={"name": "ok", "on_error": "skip"}, content=cases["surrogate"])
        assert kept.status_code == 201 and kept.json()["record_count"] == 1
        assert client.get(f"/datasets/{kept.json()['id']}/records").status_code == 200


def test_an_item_over_the_size_limit_is_413_with_its_line(service: LiveService) -> None:
    huge = _record(padding="x" * (MAX_ITEM_BYTES + 10))
    with service.client() as client:
        for body, line in (
            (_record() + b"\n" + _record() + b"\n" + huge + b"\n", 3),
            (b"[" + _record() + b"," + huge + b"]", 1),
        ):
            refused = client.post("/datasets", params={"name": "big"}, content=body)
            assert refused.status_code == 413, refused.text[:300]
            error = refused.json()["error"]
            assert error["code"] == "PAYLOAD_TOO_LARGE" and error["details"]["limit_bytes"] == MAX_ITEM_BYTES
            assert error["details"]["line"] == line
        assert client.get("/datasets").json()["count"] == 0


def test_query_values_the_database_cannot_hold_are_4xx(service: LiveService) -> None:
    with service.client() as client:
        for path, params in (
            ("/runs/r1/metrics", {"min_step": str(1 << 70)}),
            ("/runs/r1/metrics", {"max_step": "-1"}),
            ("/jobs/ab%00cd", {}),
            ("/collections/col%00x", {}),
            ("/datasets", {"name": "a\x00b"}),
            ("/runs", {"status": "running\x00"}),
        ):
            answer = client.get(path, params=params)
            assert 400 <= answer.status_code < 500, (path, params, answer.status_code, answer.text)
            assert answer.json()["error"]["code"]
        for environment in ("\x00", "echo\x00"):  # PostgreSQL's read on the event loop once answered 500
            answer = client.get("/runs", params={"environment": environment})
            # SQLite holds the value (nothing matches); PostgreSQL cannot: 422 INVALID_VALUE.
            assert answer.status_code in (200, 422), answer.text
            if answer.status_code == 422:
                assert answer.json()["error"]["code"] == "INVALID_VALUE"
            else:
                assert answer.json()["runs"] == []


def test_a_json_body_that_is_not_utf8_or_too_deep_is_422(service: LiveService) -> None:
    """Both were FastAPI's undocumented 400 "error parsing the body" (found by the schemathesis run)."""
    headers = {"Content-Type": "application/json"}
    with service.client() as client:
        for body in (b"\xff\xfe(\xa7^\xb3", b"[" * 100_000 + b"]" * 100_000):
            answer = client.post("/collections", content=body, headers=headers)
            assert answer.status_code == 422, answer.text[:300]
            assert answer.json()["error"]["code"] == "VALIDATION_ERROR"
            assert answer.json()["error"]["details"]["errors"][0]["type"] == "json_invalid"


def test_nested_json_on_mcp_is_a_4xx(service: LiveService) -> None:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    nested = '{"a":' * 5000 + "1" + "}" * 5000
    bodies = (
        "[" * 5000 + "]" * 5000,
        nested,
        '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ' + nested + "}",
        '{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": ' + nested + "}",
    )
    with service.client() as client:
        for body in bodies:
            answer = client.post("/mcp", content=body, headers=headers)
            assert 400 <= answer.status_code < 500, (body[:80], answer.status_code, answer.text[:300])
        assert client.get("/healthz").status_code == 200


def test_a_chunked_body_over_the_limit_is_413(make_settings: Any) -> None:
    settings = make_settings(max_body_bytes=4096, collection_max_body_bytes=4096)

    def chunks() -> Iterator[bytes]:
        yield b'{"name": "big", "prompts": ['
        for _ in range(200):
            yield b'{"prompt": "' + b"x" * 100 + b'"},'
        yield b'{"prompt": "y"}], "base_url": "http://127.0.0.1:9/v1", "model": "m"}'

    with live_service(settings) as live, live.client() as client:
        for path in ("/collections", "/environments/echo/config/preview"):
            answer = client.post(path, content=chunks(), headers={"Content-Type": "application/json"})
            assert answer.status_code == 413, (path, answer.text)
            assert answer.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"


def test_a_client_gone_mid_upload_is_not_a_server_error(make_settings: Any) -> None:
    with live_service(make_settings()) as service:  # a real socket: the client hangs up on it
        host, port = service.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as raw:
            raw.sendall(
                b"POST /datasets?name=gone HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n" + _record() + b"\n"
            )
        with service.client() as client:
            # Served after the broken one (one connection at a time is not promised: wait for its count).
            def counted() -> str | None:
                text = client.get("/metrics").text
                return text if 'route="/datasets"' in text else None

            metrics = wait_until(counted, timeout=scaled(30), message="the broken upload is accounted")
            assert 'status="500"' not in metrics
            assert client.get("/datasets").json()["count"] == 0


def test_unauthorized_answers_name_the_scheme(make_settings: Any) -> None:
    with (
        live_service(make_settings(api_token="tok-1")) as live,
        httpx.Client(base_url=live.base_url, timeout=REQUEST_TIMEOUT) as anonymous,
    ):
        for answer in (anonymous.get("/runs"), anonymous.post("/mcp", json={})):
            assert answer.status_code == 401 and answer.headers["WWW-Authenticate"] == "Bearer"
        with live.client() as client:
            assert client.get("/mcp").status_code == 405  # no idle event streams to hold open


def test_a_bad_tool_session_on_mcp_is_a_tool_error_with_its_code(make_settings: Any) -> None:
    async def attempt(base_url: str) -> Any:
        headers = {"Authorization": "Bearer tok-2", "X-Tool-Session": "../../bad session"}
        async with (
            create_mcp_http_client(headers=headers) as http_client,
            streamable_http_client(f"{base_url}/mcp", http_client=http_client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await session.call_tool("rl_list_environments", {})

    with live_service(make_settings(api_token="tok-2")) as live:
        result = anyio.run(attempt, live.base_url)
    assert result.is_error is True and "Traceback" not in str(result)
    assert result.structured_content["code"] == "INVALID_NAME"


def test_log_lines_hold_no_line_break_from_a_request() -> None:
    record = logging.LogRecord("rlctl.access", logging.INFO, __file__, 1, "%s %s", ("GET", "/x\r\nFORGED 200"), None)
    SecretScrubber(["sk-1"]).filter(record)
    line = logging.Formatter("%(message)s").format(record)
    assert "\n" not in line and "\r" not in line and line == "GET /x\\r\\nFORGED 200"
    escaped = logging.LogRecord("x", logging.INFO, __file__, 1, "key sk-1 \x1b[31m", None, None)
    SecretScrubber(["sk-1"]).filter(escaped)
    assert escaped.getMessage() == "key *** \\x1b[31m"


def test_keys_go_only_over_https_or_loopback() -> None:
    settings = Settings(_env_file=None, collection_api_key="sk-c", collection_key_hosts="openrouter.ai:127.0.0.1")
    ctx: Any = SimpleNamespace(settings=settings)
    assert chat_api_key(ctx, "https://openrouter.ai/api/v1") == "sk-c"
    assert chat_api_key(ctx, "http://127.0.0.1:8001/v1") == "sk-c"
    for refused in ("http://openrouter.ai/api/v1", "https://openrouter.ai:8443/v1", "https://evil.example/v1"):
        assert chat_api_key(ctx, refused) == "no-key", refused


def test_model_ids_map_to_distinct_safe_file_names() -> None:
    ids = ["m/x", "m_x", "m%2Fx", "a b", "../../etc", "x" * 400, "x" * 401, "é/ü"]
    stems = [result_file_stem("echo", model) for model in ids]
    assert len(set(stems)) == len(ids)
    assert all("/" not in stem and " " not in stem and len(stem) <= 200 for stem in stems)
    assert result_file_stem("gsm8k", "qwen/qwen3-8b") == "test_gsm8k_qwen_qwen3-8b"


def test_health_answers_while_megabytes_of_hostile_tags_are_parsed(tmp_path: Path) -> None:
    # The former parser took minutes on each of these, holding the interpreter: /healthz waited as long. Now each
    # probe answers within a second (scaled for a slower machine; figures: benchmarks/security.py).
    # The service is a process of its own: a frozen interpreter must not be this test's.
    megabyte = 1 << 20
    bodies = [
        _record(messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": tag * (megabyte // 11)}])
        for tag in ("<tool_call>", "<think>", "<tool_response>", "<tools>")
    ]
    environment = {"RLCTL_DATA_DIR": str(tmp_path / "var"), "RLCTL_DATABASE_URL": f"sqlite:///{tmp_path / 'db'}"}
    outcome: list[int] = []
    with service_process(environment, tmp_path / "service.log") as live:

        def upload() -> None:
            with httpx.Client(base_url=live.base_url, timeout=60) as client:
                outcome.extend(client.post("/datasets", params={"name": "h"}, content=b).status_code for b in bodies)

        worker = threading.Thread(target=upload, daemon=True)
        worker.start()
        answered = 0
        with httpx.Client(base_url=live.base_url, timeout=scaled(1.0)) as probe:
            while worker.is_alive() or answered == 0:
                assert probe.get("/healthz").status_code == 200
                answered += 1
        worker.join(timeout=60)
    assert outcome == [201, 201, 201, 201]
