"""Who may reach a run's inference server, and how much they may send (docs/SECURITY.md#a-runs-inference-server).

The server listens on loopback, where any local process could otherwise sample from the run, spend its failure
budget or send it megabytes. Each run's launch makes a fresh key (RLCTL_RUN_INFERENCE_KEY, in the trainer's and
the environment process's environments only, never a file or a log line); every route but `/health` needs
`Authorization: Bearer <key>`, and a request body is read up to MAX_BODY_BYTES, never further.
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

KEY_ENV = "RLCTL_RUN_INFERENCE_KEY"
OPEN_PATHS = frozenset({"/health"})  # the supervisor's readiness probe carries no key
MAX_BODY_BYTES = 4 << 20  # a prompt of 4 MiB is far beyond any context; an 8 MB one drove the trainer to 3.5 GB


class InferenceGuard:
    """Pure ASGI: the key checked from the headers and the body bounded before the app (and its JSON parser)
    sees a byte. Without a key (a server started by hand, `python -m rlctl.trainer.serve`), only the bound holds."""

    def __init__(self, app: ASGIApp, key: str | None, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.key = key.encode() if key else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        if self.key is not None and not _bearer_matches(headers.get(b"authorization", b""), self.key):
            await _refuse(send, 401, "a valid bearer key of this run is required", "invalid_api_key")
            return
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await _refuse(send, 413, self._too_large(), "request_too_large")
            return
        body = await _read_bounded(receive, self.max_body_bytes)
        if body is None:
            await _refuse(send, 413, self._too_large(), "request_too_large")
            return
        await self.app(scope, _replay(body, receive), send)

    def _too_large(self) -> str:
        return f"the request body is over {self.max_body_bytes} bytes"


def _bearer_matches(authorization: bytes, key: bytes) -> bool:
    scheme, _, given = authorization.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), key)


async def _read_bounded(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None as soon as it passes `limit` (the rest is never read)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: the client's disconnect

    return replay


async def _refuse(send: Send, status: int, message: str, code: str) -> None:
    """OpenAI's error shape, as the server's other errors."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": code}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
