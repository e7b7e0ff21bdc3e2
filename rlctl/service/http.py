"""HTTP plumbing shared by every domain: error mapping, request ids, body size limits, the server's settings."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from rlctl.service.errors import ClientGone, InvalidValue, PayloadTooLarge, RateLimited, ServiceError
from rlctl.service.observability import request_id_var, scrub_json
from rlctl.service.schemas import present_paths_in, presenting_paths
from rlctl.service.settings import Settings

logger = logging.getLogger("rlctl.http")

_HTTP_CODES = {
    400: "BAD_REQUEST",
    401: "UNAUTHORIZED",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    406: "NOT_ACCEPTABLE",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
}
# Validation errors may carry any input value (bytes, exceptions): shown as text.
_LENIENT: dict[Any, Any] = {bytes: lambda b: b.decode("utf-8", "replace"), Exception: str}
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def error_response(error: ServiceError) -> JSONResponse:
    headers = {}
    if isinstance(error, RateLimited):
        headers["Retry-After"] = str(max(1, int(error.retry_after_s + 0.999)))
    if error.status_code == 401:
        headers["WWW-Authenticate"] = "Bearer"  # RFC 6750: how to authenticate
    return JSONResponse(error.to_body(request_id_var.get()), status_code=error.status_code, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def handle_service_error(request: Request, exc: ServiceError) -> JSONResponse:
        # An error may carry text of untrusted code (an environment's import traceback): no secret leaves in it.
        scrub = request.app.state.context.scrub
        exc.message, exc.details = scrub(exc.message), scrub_json(exc.details, scrub)
        exc.message, exc.details = present_paths_in(exc.message), present_paths_in(exc.details)  # a locked path
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def handle_validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"location": list(e.get("loc", ())), "message": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors()
        ]
        error = ServiceError("the request is not valid", {"errors": jsonable_encoder(errors, custom_encoder=_LENIENT)})
        error.status_code, error.code = 422, "VALIDATION_ERROR"
        return error_response(error)

    @app.exception_handler(ClientDisconnect)
    async def handle_disconnect(_request: Request, _exc: ClientDisconnect) -> JSONResponse:
        # The client went away mid-body: its fault, not the service's; nobody reads this answer.
        return error_response(ClientGone("the client disconnected before its request body ended"))

    @app.exception_handler(DataError)
    async def handle_data_error(_request: Request, exc: DataError) -> JSONResponse:
        # A value the database cannot hold (a NUL character in PostgreSQL text, a number out of range).
        logger.info("a value was refused by the database: %s", type(exc.orig).__name__)
        return error_response(InvalidValue("a value of the request cannot be stored (e.g. a NUL character)"))

    @app.exception_handler(StarletteHTTPException)
    async def handle_http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, ServiceError):  # raised while the framework read the body (e.g. over its limit)
            return error_response(exc.__cause__)
        if isinstance(exc.__cause__, ClientDisconnect):
            return error_response(ClientGone("the client disconnected before its request body ended"))
        if isinstance(exc.__cause__, UnicodeDecodeError | RecursionError):
            # A JSON body that is not UTF-8, or nested past the parser's depth: invalid JSON, answered as
            # FastAPI answers any other (422), not with its undocumented 400.
            return error_response(_invalid_json_body(exc.__cause__))
        error = ServiceError(str(exc.detail))
        error.status_code, error.code = exc.status_code, _HTTP_CODES.get(exc.status_code, "HTTP_ERROR")
        response = error_response(error)
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    @app.exception_handler(Exception)
    async def handle_unexpected(_request: Request, exc: Exception) -> JSONResponse:
        # The trace goes to the log, never to the client.
        logger.exception("unhandled error", exc_info=exc)
        error = ServiceError("internal error; the request id identifies it in the service log")
        error.status_code, error.code = 500, "INTERNAL_ERROR"
        return error_response(error)


def _invalid_json_body(cause: Exception) -> ServiceError:
    why = "not UTF-8" if isinstance(cause, UnicodeDecodeError) else "nested too deeply"
    problem = {"location": ["body"], "message": f"the JSON body is {why}", "type": "json_invalid"}
    error = ServiceError("the request is not valid", {"errors": [problem]})
    error.status_code, error.code = 422, "VALIDATION_ERROR"
    return error


class RequestIdMiddleware:
    """Gives every request an id (the caller's X-Request-ID when well formed), in logs and responses."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        token = request_id_var.set(request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", []).append((b"x-request-id", request_id.encode()))
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id_var.reset(token)


class PathPresentingMiddleware:
    """Every response of the request shows server paths relative to their roots (docs/SECURITY.md)."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app, self.settings = app, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with presenting_paths(self.settings):
            await self.app(scope, receive, send)


class BodySizeLimitMiddleware:
    """Refuses bodies over the limit for their route (413), counting streamed bytes, not trusting headers."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[Scope], int]) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _send_too_large(scope, receive, send, limit)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise PayloadTooLarge(f"request body over the limit of {limit} bytes", {"limit_bytes": limit})
            return message

        await self.app(scope, limited_receive, send)


async def _send_too_large(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
    error = PayloadTooLarge(f"request body over the limit of {limit} bytes", {"limit_bytes": limit})
    await error_response(error)(scope, receive, send)


# Paths a load balancer or an orchestrator polls to learn whether the process lives and is ready.
PROBE_PATHS = frozenset({"/healthz", "/readyz"})


class ProbesFirstProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, but a probe's request runs ahead of the requests already queued on the loop.

    A request's task normally joins the back of the loop's ready queue: under a burst of reads (200 connections),
    a probe waits behind every request that arrived before it, and a liveness check could fail while the process
    is only busy. Here a probe's first step moves to the front, and /healthz and /readyz (async routes that do not
    wait on anything but an in-process read) finish in that step. Only asyncio's loop exposes its ready queue
    (`server_config` picks it); on another loop this protocol behaves as its base.

    Measured by `benchmarks/runs.py --reads-only --servers` (probes beside 200 connections of reads, wrk): p99 of
    the probes 0.51-0.68 s with it against 0.59-1.18 s without; on a machine at load average 7-9, within its noise
    (docs/ARCHITECTURE.md#performance). Delete it when uvicorn or asyncio gives requests a priority of their own,
    or when that benchmark no longer shows a difference beyond its noise.
    """

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        super()._start_asgi_task(cycle, app)
        ready = getattr(self.loop, "_ready", None)
        if cycle.scope["path"] in PROBE_PATHS and ready:
            ready.appendleft(ready.pop())  # the task's first step, just scheduled at the back


def server_config(app: ASGIApp, host: str, port: int, **overrides: Any) -> uvicorn.Config:
    """The settings the service is served with, by `rlctl serve` and by the tests' live services alike.

    asyncio's loop, not uvloop: uvloop's scheduling left some of 200 keep-alive connections waiting seconds while
    others were served (p99 of GET /runs/{id} 4.2 s against 0.8 s on asyncio's loop, `benchmarks/runs.py`,
    docs/ARCHITECTURE.md#performance)."""
    settings: dict[str, Any] = {
        "host": host,
        "port": port,
        "loop": "asyncio",
        "http": ProbesFirstProtocol,
        "log_config": None,
        "access_log": False,
    }
    return uvicorn.Config(app, **(settings | overrides))
