"""Wires metrics and access logging into the app: one registry per app (tests run several apps at once)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.concurrency import run_in_threadpool

from rlctl.service.auth.guard import READ
from rlctl.service.context import AppContext
from rlctl.service.monitoring.access import AccessMiddleware, HttpMetrics, RouteTemplates
from rlctl.service.monitoring.state import DatabaseStateCollector


def install_monitoring(app: FastAPI, context: AppContext) -> None:
    """Adds the metrics' registry (served by `metrics_router`, behind the token) and the access middleware.

    Call it after adding the body-size limit and before the request-id middleware: each `add_middleware`
    wraps the ones before it, so requests then pass request id → access → body limit → routes.
    """
    registry = CollectorRegistry()
    registry.register(DatabaseStateCollector(context.db))
    app.state.metrics_registry = registry
    templates = RouteTemplates(lambda: _route_paths(app))
    app.add_middleware(AccessMiddleware, metrics=HttpMetrics(registry), templates=templates)


def _route_paths(app: FastAPI) -> list[str]:
    """The documented paths, then the routes outside the OpenAPI document (/mcp, /metrics), so that none of
    them is counted as unmatched."""
    paths = list(app.openapi()["paths"])
    others = (getattr(route, "path", None) for route in app.routes)
    return [*paths, *(path for path in others if isinstance(path, str) and path not in paths)]


def metrics_router() -> APIRouter:
    """/metrics: the app includes it behind the token."""
    router = APIRouter()

    @router.get("/metrics", include_in_schema=False, openapi_extra=READ)
    async def prometheus_metrics(request: Request) -> Response:
        """Prometheus text format; state gauges are read from the database now."""
        body = await run_in_threadpool(generate_latest, request.app.state.metrics_registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return router
