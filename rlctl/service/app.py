"""The FastAPI application: routers by domain, one error body, auth on everything but health and docs."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.routing import Route
from starlette.types import Scope

from rlctl.service.auth.guard import AuthenticationGate, document_bearer
from rlctl.service.collections import jobs as collection_jobs
from rlctl.service.collections import routes as collection_routes
from rlctl.service.context import AppContext
from rlctl.service.datasets import jobs as dataset_jobs
from rlctl.service.datasets import routes as dataset_routes
from rlctl.service.datasets.service import open_datasets
from rlctl.service.db import migrate
from rlctl.service.db.engine import REQUEST_THREADS
from rlctl.service.environments.routes import router as environments_router
from rlctl.service.evaluations import jobs as evaluation_jobs
from rlctl.service.evaluations.routes import router as evaluations_router
from rlctl.service.health.listener import ProbeListener
from rlctl.service.health.readiness import ReadinessMonitor
from rlctl.service.health.routes import readiness_monitor
from rlctl.service.health.routes import router as health_router
from rlctl.service.http import (
    BodySizeLimitMiddleware,
    PathPresentingMiddleware,
    RequestIdMiddleware,
    install_error_handlers,
)
from rlctl.service.inference_tests import jobs as inference_test_jobs
from rlctl.service.inference_tests.routes import router as inference_tests_router
from rlctl.service.jobs.routes import router as jobs_router
from rlctl.service.jobs.runner import JobRunner
from rlctl.service.monitoring import install_monitoring, metrics_router
from rlctl.service.runs.manager import RunManager
from rlctl.service.runs.routes import logs_router as run_logs_router
from rlctl.service.runs.routes import node_router as run_node_router
from rlctl.service.runs.routes import router as runs_router
from rlctl.service.settings import Settings
from rlctl.service.startup import build_app_context, start_up_work
from rlctl.service.tools.mcp_server import McpEndpoint
from rlctl.service.tools.routes import router as tools_router
from rlctl.service.ui.routes import router as ui_router

logger = logging.getLogger("rlctl")

API_DESCRIPTION = """\
REST control plane for reinforcement-learning fine-tuning of language models on Tinker + Atropos.

Every route but `/healthz`, `/readyz` and the docs needs `Authorization: Bearer <token>` when the server has a
token: `RLCTL_API_TOKEN` (every scope) or one of the tokens file, whose scopes (read, operate, admin) each route
names; a token without the scope gets 403 `INSUFFICIENT_SCOPE`.
Errors share one body: `{"error": {"code", "message", "details"}}`.
"""


# Behind the token (each route's declared scope), checked by the AuthenticationGate before any body is read.
# Health, the UI page (a static file), the docs and the Ray nodes' calls are not. Runs first: a request is matched
# against the routes in order, twice (the gate, then the router), and a run's record and the runs' pages are the
# hottest reads (GET /runs/{id} 0.344 -> 0.324 ms CPU, benchmarks/read_cpu.py); the prefixes differ, so the order
# changes no match.
PROTECTED_ROUTERS = (
    runs_router,
    environments_router,
    run_logs_router,
    jobs_router,
    dataset_routes.router,
    dataset_routes.downloads_router,
    collection_routes.router,
    inference_tests_router,
    evaluations_router,
    tools_router,
)


def register_job_kinds(runner: JobRunner) -> None:
    """Every domain's background jobs: each domain's `jobs.job_kinds()`, registered here where the app is built."""
    kinds = (
        *dataset_jobs.job_kinds(),
        *collection_jobs.job_kinds(),
        *inference_test_jobs.job_kinds(),
        *evaluation_jobs.job_kinds(),
    )
    for kind in kinds:
        runner.register(kind)


async def _probe_listener(context: AppContext, readiness: ReadinessMonitor) -> ProbeListener | None:
    """The probe listener, started, when `RLCTL_PROBE_PORT` asks for one (docs/ARCHITECTURE.md#probes)."""
    if context.settings.probe_port is None:
        return None
    listener = ProbeListener(readiness, context.settings)
    await listener.start()
    context.provide(listener)
    return listener


def create_app(
    settings: Settings | None = None, migrate_on_start: bool = True, context: AppContext | None = None
) -> FastAPI:
    """The app over `context` (`rlctl serve` builds it first, to begin the start-up work sooner), else a new one."""
    context = context or build_app_context(settings or Settings())
    runs = RunManager(context)
    jobs = JobRunner(context, workers=context.settings.job_workers)
    context.provide(runs)
    context.provide(jobs)
    register_job_kinds(jobs)
    readiness = readiness_monitor(context.db)
    context.provide(readiness)
    mcp_endpoint = McpEndpoint(context)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # Blocking handlers run in this many threads; the database pool keeps a connection for each of them.
        anyio.to_thread.current_default_thread_limiter().total_tokens = REQUEST_THREADS
        context.claim_data_dir()
        context.start_warm_up(
            start_up_work(context)
        )  # in the background (once; `rlctl serve` began it already): docs/RUNS.md#start-up-work
        if migrate_on_start:
            await run_in_threadpool(migrate.upgrade, context.db)
        await run_in_threadpool(runs.open)
        await run_in_threadpool(open_datasets, context)  # before jobs resume: leftovers of a crash go first
        await run_in_threadpool(jobs.open)
        await context.db.open_loop_reads()
        await readiness.start()
        probes: ProbeListener | None = None
        try:
            probes = await _probe_listener(context, readiness)
            async with mcp_endpoint.running():
                yield
        finally:
            if probes is not None:
                await probes.stop()
            await readiness.stop()
            # Runs keep running across a service restart: they are re-adopted at the next start.
            await run_in_threadpool(jobs.close)
            await run_in_threadpool(runs.close)
            await run_in_threadpool(context.stop_children)
            await context.db.close_loop_reads()
            context.db.dispose()
            context.release_data_dir()

    app = FastAPI(
        title="rlctl",
        version="0.1.0",
        description=API_DESCRIPTION,
        lifespan=lifespan,
        generate_unique_id_function=lambda route: route.name,
    )
    app.state.context = context
    install_error_handlers(app)
    app.include_router(health_router)
    app.include_router(ui_router)  # a static page; its API calls carry the token
    protected = (*PROTECTED_ROUTERS, metrics_router())
    for router in protected:
        app.include_router(router)
    document_bearer(app)
    app.include_router(run_node_router)  # runs on Ray: each call carries its run's secret (docs/RAY.md)
    mcp_route = Route("/mcp", endpoint=mcp_endpoint, methods=["GET", "POST", "DELETE"])
    app.router.routes.append(mcp_route)
    app.add_middleware(PathPresentingMiddleware, settings=context.settings)  # innermost: around every handler
    app.add_middleware(BodySizeLimitMiddleware, limit_for=_body_limit(context))
    # Outside the body limit: a caller without a valid token is answered before any byte of its body is read.
    app.add_middleware(
        AuthenticationGate,
        context=context,
        routes=app.router.routes,
        protected=protected,
        self_checked=[mcp_route],
        streamed=lambda scope: dataset_routes.body_limit(scope, context.settings) is not None,  # uploads, to disk
    )
    install_monitoring(app, context)  # the access log inside the request id
    app.add_middleware(RequestIdMiddleware)
    return app


def _body_limit(context: AppContext) -> Callable[[Scope], int]:
    def limit_for(scope: Scope) -> int:
        settings = context.settings
        own_limit = dataset_routes.body_limit(scope, settings) or collection_routes.body_limit(scope, settings)
        return own_limit or settings.max_body_bytes

    return limit_for
