"""The authentication gate: a caller without a valid token (or the scope) is answered from the headers alone,
before any byte of its body is read, and each caller's request bodies in flight are bounded together.

Each case once held the service: eight 15.6 MB POSTs without a token were parsed as JSON before the 401 and held
/healthz for seconds (benchmarks/request_gate.py measures it)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import pytest

from rlctl.service.auth.guard import AuthenticationGate
from rlctl.service.auth.scopes import Scope
from rlctl.service.auth.tokens import TokenStore
from rlctl.service.settings import Settings
from tests.support.live import LiveService, live_service
from tests.support.waiting import scaled, wait_until

ADMIN_TOKEN = "gate-admin-token-0123456789"
MEGABYTE = 1 << 20


@dataclass
class Gated:
    live: LiveService
    tokens: dict[str, str]  # name -> token

    @property
    def port(self) -> int:
        return int(self.live.base_url.rsplit(":", 1)[1])

    def gate(self) -> AuthenticationGate:
        layer: Any = self.live.app.middleware_stack
        while not isinstance(layer, AuthenticationGate):
            layer = layer.app
        return layer


@pytest.fixture
def gated(make_settings: Callable[..., Settings]) -> Iterator[Gated]:
    settings = make_settings(api_token=ADMIN_TOKEN, max_caller_body_bytes=3 * MEGABYTE)
    store = TokenStore(settings.tokens_path)
    tokens = {
        "reader": store.create("reader", (Scope.READ,)),
        "op1": store.create("op1", (Scope.OPERATE,)),
        "op2": store.create("op2", (Scope.OPERATE,)),
    }
    with live_service(settings) as live:
        yield Gated(live, tokens)


def open_request(port: int, path: str, declared: int, token: str | None, first: bytes = b"") -> socket.socket:
    """A POST declaring `declared` body bytes, of which only `first` are sent: the rest is never sent unless the
    test sends it, so an answer proves the body was not awaited."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=scaled(60))
    headers = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    headers.append(f"Content-Length: {declared}")
    if token is not None:
        headers.append(f"Authorization: Bearer {token}")
    connection.sendall(("\r\n".join(headers) + "\r\n\r\n").encode() + first)
    return connection


def read_answer(connection: socket.socket) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of the answer on `connection` (read until the declared length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        assert chunk, f"connection closed before an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    while len(body) < length:
        chunk = connection.recv(65536)
        assert chunk, "connection closed mid-answer"
        body += chunk
    return int(lines[0].split()[1]), json.loads(body[:length])


def test_no_token_and_no_scope_are_answered_before_the_body(gated: Gated) -> None:
    cases = (
        ("/collections", None, 401, "UNAUTHORIZED"),
        ("/collections", "wrong-token-0123456789", 401, "UNAUTHORIZED"),
        ("/collections", gated.tokens["reader"], 403, "INSUFFICIENT_SCOPE"),
        ("/datasets?name=x", None, 401, "UNAUTHORIZED"),
        ("/environments/x/rollback", gated.tokens["op1"], 403, "INSUFFICIENT_SCOPE"),
        ("/mcp", None, 401, "UNAUTHORIZED"),
    )
    for path, token, status, code in cases:
        # 15 MB declared, 10 bytes sent: the answer comes without the rest of the body.
        with closing(open_request(gated.port, path, 15 * MEGABYTE, token, first=b'{"prompts"')) as connection:
            answered, body = read_answer(connection)
        assert (answered, body["error"]["code"]) == (status, code), (path, token, body)
    assert gated.gate().in_flight == {}


def test_a_callers_bodies_in_flight_are_bounded_together(gated: Gated) -> None:
    op1, op2 = gated.tokens["op1"], gated.tokens["op2"]
    held = open_request(gated.port, "/collections", 2 * MEGABYTE, op1, first=b"x" * (3 * MEGABYTE // 2))
    with closing(held):
        gate = gated.gate()
        wait_until(lambda: gate.in_flight.get("token:op1", 0) >= MEGABYTE, timeout=scaled(30), message="body read")
        # The same caller again: its declared body would put it over 3 MiB in flight; refused unread.
        with closing(open_request(gated.port, "/collections", 2 * MEGABYTE, op1)) as second:
            status, body = read_answer(second)
        assert (status, body["error"]["code"]) == (413, "PAYLOAD_TOO_LARGE")
        assert body["error"]["details"]["limit_bytes"] == 3 * MEGABYTE
        # Another caller is not charged for it: its whole body is read (and refused as not JSON).
        other = open_request(gated.port, "/collections", 2 * MEGABYTE, op2, first=b"y" * (2 * MEGABYTE))
        with closing(other):
            status, body = read_answer(other)
        assert status == 422, body
        # The held request ends: its bytes are released, and the same caller is admitted again.
        held.sendall(b"x" * (MEGABYTE // 2))
        status, _ = read_answer(held)
        assert status == 422
    wait_until(lambda: gate.in_flight == {}, timeout=scaled(30), message="every body released")
    with closing(open_request(gated.port, "/collections", 2 * MEGABYTE, op1, first=b"z" * (2 * MEGABYTE))) as again:
        assert read_answer(again)[0] == 422


def test_a_body_over_the_callers_budget_without_a_length_is_cut_off(gated: Gated) -> None:
    """Chunked: no declared length to refuse up front; counted as it arrives, refused past the budget."""
    connection = socket.create_connection(("127.0.0.1", gated.port), timeout=scaled(60))
    with closing(connection):
        head = f"POST /collections HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {gated.tokens['op1']}\r\n"
        connection.sendall((head + "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode())
        chunk = b"a" * MEGABYTE
        try:
            for _ in range(5):
                connection.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        except OSError:
            pass  # the service answered and closed the connection: the answer is still readable
        status, body = read_answer(connection)
    assert (status, body["error"]["code"]) == (413, "PAYLOAD_TOO_LARGE"), body
    wait_until(lambda: gated.gate().in_flight == {}, timeout=scaled(30), message="the body released")


def test_an_upload_streamed_to_disk_is_not_charged_to_the_budget(gated: Gated) -> None:
    """Uploads go to disk as they arrive, with their own limit: one over the in-memory budget is accepted."""
    line = json.dumps({"messages": [{"role": "user", "content": "x" * 1000}, {"role": "assistant", "content": "4"}]})
    upload = (line + "\n").encode() * (4 * MEGABYTE // len(line))
    assert len(upload) > 3 * MEGABYTE
    with gated.live.client(token=gated.tokens["op1"]) as client:
        stored = client.post("/datasets", params={"name": "big"}, content=upload)
    assert stored.status_code == 201, stored.text[:300]
    assert gated.gate().in_flight == {}


def test_open_routes_and_valid_calls_pass(gated: Gated) -> None:
    with gated.live.client(token=gated.tokens["reader"]) as client:
        assert client.get("/runs").status_code == 200
        assert client.get("/metrics").status_code == 200
    with gated.live.anonymous() as anonymous:
        assert anonymous.get("/healthz").status_code == 200
        assert anonymous.get("/runs").status_code == 401
