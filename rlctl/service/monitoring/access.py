"""Per-request bookkeeping: the Prometheus HTTP metrics and one access log line per request."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rlctl.service.observability import request_id_var

access_logger = logging.getLogger("rlctl.access")
UNMATCHED_ROUTE = "unmatched"  # one label for every path no route matched, so scanners cannot blow up the series
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})  # others count as OTHER


class HttpMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "rlctl_http_requests",
            "HTTP requests answered, by method, route template and status.",
            ["method", "route", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "rlctl_http_request_duration_seconds",
            "Time from the request's arrival to the end of its response, by method and route template.",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    def observe(self, method: str, route: str, status: int, duration_s: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(duration_s)


def route_template(scope: Scope, templates: RouteTemplates) -> str:
    """`/runs/{run_id}`, not `/runs/abc123`. The router leaves the matched route in the scope; a request refused
    before routing (e.g. a body over the limit) is matched against the documented paths instead."""
    path = getattr(scope.get("route"), "path", None)
    if isinstance(path, str):
        return path
    return templates.match(scope["path"]) or UNMATCHED_ROUTE


class RouteTemplates:
    """The API's path templates (from its OpenAPI document), compiled on first use."""

    def __init__(self, paths: Callable[[], Iterable[str]]) -> None:
        self._paths = paths
        self._compiled: list[tuple[re.Pattern[str], str]] | None = None

    def match(self, path: str) -> str | None:
        if self._compiled is None:
            self._compiled = [(_template_pattern(t), t) for t in self._paths()]
        return next((template for pattern, template in self._compiled if pattern.fullmatch(path)), None)


def _template_pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^}]+\})", template)
    return re.compile("".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts))


class AccessMiddleware:
    """Measures each request and logs it. Sits inside RequestIdMiddleware, so the log line has the request id,
    and outside the body-size limit, so refused bodies are counted too."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics, templates: RouteTemplates) -> None:
        self.app = app
        self.metrics = metrics
        self.templates = templates

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client gets when the app raises before answering

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            try:
                self._record(scope, status, time.perf_counter() - started)
            except Exception:  # noqa: BLE001 - bookkeeping must never change a response
                logging.getLogger("rlctl.monitoring").exception("recording a request failed")

    def _record(self, scope: Scope, status: int, duration_s: float) -> None:
        method, route = scope["method"], route_template(scope, self.templates)
        self.metrics.observe(method if method in KNOWN_METHODS else "OTHER", route, status, duration_s)
        duration_ms = round(duration_s * 1000, 1)
        fields = {
            "method": method,
            "route": route,
            "path": scope["path"],
            "status": status,
            "duration_ms": duration_ms,
            "request_id": request_id_var.get(),
            "token": scope.get("state", {}).get("token_name") or "-",  # its name, set by authentication
        }
        access_logger.info(
            "%s %s %s %.1f ms route=%s token=%s",
            method,
            scope["path"],
            status,
            duration_ms,
            route,
            fields["token"],
            extra=fields,
        )
