"""HTTP routes of runs: thin adapters over rlctl.service.runs.service."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi import Path as Path_
from fastapi.responses import PlainTextResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from rlctl.service.auth.guard import OPERATE, READ
from rlctl.service.context import AppContext
from rlctl.service.deps import Ctx, context_of
from rlctl.service.names import name_path
from rlctl.service.pagination import QueryModel
from rlctl.service.runs import archive, node, service
from rlctl.service.runs.manager import RunManager
from rlctl.service.runs.paths import RunPaths
from rlctl.service.runs.schemas import (
    CheckpointPins,
    CreateRunRequest,
    NodePlan,
    NodeReport,
    NodeReportAnswer,
    ProcessRole,
    PromptSplit,
    RateLimitedBody,
    ResumeRunRequest,
    RunList,
    RunListQuery,
    RunMetrics,
    RunOut,
    RunPrompts,
    RunResults,
    RunStatusOut,
)
from rlctl.service.schemas import error_responses, json_error_responses, link, linked, response

router = APIRouter(prefix="/runs", tags=["runs"], responses=error_responses(401, 403))
# Logs answer text/plain; their errors stay JSON, so they are documented apart from the router's.
logs_router = APIRouter(prefix="/runs", tags=["runs"])
# The internal channel of runs on Ray (docs/RAY.md#authentication): a run's node-side supervisor calls it with the run's
# secret, never a bearer token, so it is included without the token check; left out of the OpenAPI schema.
node_router = APIRouter(prefix="/runs", tags=["internal"], include_in_schema=False)
RunSecret = Annotated[str | None, Header(alias="X-Rlctl-Run-Secret", max_length=256)]
RunId = Annotated[str, name_path("Run id, as returned by POST /runs.")]
FOLLOW_POLL_S = 0.25
MAX_STEP = (1 << 63) - 1  # a step the databases can compare with (a larger one overflowed SQLite: 500)
CheckpointStep = Annotated[int, Path_(ge=0, le=MAX_STEP, description="The checkpoint's step.")]


@router.post(
    "",
    response_model=RunOut,
    status_code=201,
    summary="Start a training run",
    responses=linked(
        201,
        "The recorded run",
        {
            "GetRun": link("get_run", run_id="id"),
            "CheckRunStatus": link("check_run_status", run_id="id"),
            "StopRun": link("stop_run", run_id="id"),
        },
    )
    | error_responses(404, 409, 413, 422),
    openapi_extra=OPERATE,
)
async def create_run(ctx: Ctx, body: CreateRunRequest, response: Response) -> RunOut:
    """Validate the config, record the run, then start its three processes (API, trainer, environment).

    The response comes at once with status `pending`, `starting`, or `queued` with its `queue_position` when the
    executor is full (`resources` and `priority` decide when it starts); poll `GET /runs/{id}`. With an
    `idempotency_key`, a retried request gets the run the first one created (header `Idempotent-Replayed: true`)
    instead of a new one.
    """
    run, created = await run_in_threadpool(service.create_run, ctx, RunManager.of(ctx), body)
    if not created:
        response.headers["Idempotent-Replayed"] = "true"
    return run


RUN_LIST_QUERY = QueryModel(RunListQuery)


@router.get(
    "",
    response_model=RunList,
    summary="List runs",
    responses=error_responses(422),
    openapi_extra=READ | {"parameters": RUN_LIST_QUERY.parameters()},
)
async def list_runs(request: Request) -> Response:
    """Newest first, `limit` at a time; with `status=queued`, the queue in the order it starts."""
    query = RUN_LIST_QUERY.read(request.query_params)
    page = (query.status, query.environment, query.limit, query.cursor, query.dataset_id)
    # A RunList's JSON, which the database writes (service.list_runs_plan): sent as it is, not validated again.
    body = await context_of(request).db.shared_read(("runs", *page), service.list_runs_plan, *page)
    return Response(body, media_type="application/json")


@router.get(
    "/{run_id}",
    response_model=RunOut,
    summary="Get a run's record",
    responses=error_responses(404, 422),
    openapi_extra=READ,
)
async def get_run(request: Request, run_id: RunId) -> Response:
    """The stored record: never rate-limited (the live check is GET /runs/{id}/status)."""
    # A RunOut's JSON (service.run_record_body_plan): sent as it is, not validated again.
    ctx = context_of(request)
    body = await ctx.db.shared_read(("run", run_id), service.run_record_body_plan, ctx, run_id)
    return Response(body, media_type="application/json")


@router.get(
    "/{run_id}/status",
    response_model=RunStatusOut,
    summary="Check a run live (rate limited)",
    responses=response(429, "Checked too recently; see Retry-After", model=RateLimitedBody) | error_responses(404, 422),
    openapi_extra=READ,
)
async def check_run_status(ctx: Ctx, run_id: RunId) -> RunStatusOut:
    """Processes, running time and latest metrics, looked at now. One check per run per
    `RLCTL_STATUS_CHECK_INTERVAL_S` (30 minutes by default): a check within the interval answers 429 with
    `Retry-After`, `next_check_in_seconds` and the last snapshot. An unknown id is 404 and uses nothing. A
    read-only token never checks live: it gets the last snapshot (`live: false`), or 429 before the first."""
    return await run_in_threadpool(service.check_status, ctx, run_id)


@router.post(
    "/{run_id}/stop",
    response_model=RunOut,
    summary="Stop a run",
    responses=error_responses(404, 409, 422),
    openapi_extra=OPERATE,
)
async def stop_run(
    ctx: Ctx,
    run_id: RunId,
    wait_s: Annotated[float, Query(ge=0, le=600, description="Wait up to this long for the run to end.")] = 0,
) -> RunOut:
    """Environment, then trainer, then API: SIGTERM to each process group, SIGKILL after the grace period.
    A run still starting stops starting; a queued run ends `stopped` without starting. A run that has already ended
    is a 409 INVALID_STATE."""
    return await run_in_threadpool(service.stop_run, ctx, RunManager.of(ctx), run_id, wait_s)


@router.post(
    "/{run_id}/resume",
    response_model=RunOut,
    summary="Resume a stopped or failed run",
    responses=error_responses(404, 409, 422),
    openapi_extra=OPERATE,
)
async def resume_run(ctx: Ctx, run_id: RunId, body: ResumeRunRequest | None = None) -> RunOut:
    """Continue the run from its newest checkpoint (or the one of `step`) with its optimiser state: the same run id,
    its metrics kept up to that step, later checkpoints dropped. It goes `pending` and starts like a new run. A run
    that is not stopped or failed is a 409 INVALID_STATE; one without that checkpoint 404 CHECKPOINT_NOT_FOUND."""
    request = body or ResumeRunRequest()
    return await run_in_threadpool(service.resume_run, ctx, RunManager.of(ctx), run_id, request)


@logs_router.get(
    "/{run_id}/checkpoints/{step}/archive",
    response_class=StreamingResponse,
    summary="Download a checkpoint's weights",
    responses=response(200, "A tar archive: the LoRA adapter and its config", media_type="application/x-tar")
    | json_error_responses(401, 403, 404, 409, 422),
    openapi_extra=READ,
)
async def get_checkpoint_archive(ctx: Ctx, run_id: RunId, step: CheckpointStep) -> StreamingResponse:
    """A local checkpoint as a tar stream: `{run}-step_{N}/` with `adapter_model.safetensors`,
    `adapter_config.json` and `trainer_checkpoint.json` (not the optimiser state). Load it with peft, serve it with
    `rlctl model serve --adapter`, or merge it with `rlctl model merge`. A checkpoint on the Tinker service is a
    409 INVALID_STATE (download it from Tinker); a step without one 404 CHECKPOINT_NOT_FOUND."""
    top, files = await run_in_threadpool(service.checkpoint_archive, ctx, run_id, step)
    return StreamingResponse(
        archive.tar_stream(top, files),
        media_type="application/x-tar",
        headers={"Content-Disposition": f'attachment; filename="{top}.tar"'},
    )


@router.put(
    "/{run_id}/checkpoints/{step}/pin",
    response_model=CheckpointPins,
    summary="Pin a checkpoint against retention",
    responses=error_responses(404, 422),
    openapi_extra=OPERATE,
)
async def pin_checkpoint(ctx: Ctx, run_id: RunId, step: CheckpointStep) -> CheckpointPins:
    """A run with `keep_last_n` deletes its older checkpoints; a pinned one stays (docs/TRAINER.md#retention)."""
    return await run_in_threadpool(service.pin_checkpoint, ctx, run_id, step, True)


@router.delete(
    "/{run_id}/checkpoints/{step}/pin",
    response_model=CheckpointPins,
    summary="Unpin a checkpoint",
    responses=error_responses(404, 422),
    openapi_extra=OPERATE,
)
async def unpin_checkpoint(ctx: Ctx, run_id: RunId, step: CheckpointStep) -> CheckpointPins:
    """Retention may delete it again (at the run's next checkpoint) unless it is among the kept ones."""
    return await run_in_threadpool(service.pin_checkpoint, ctx, run_id, step, False)


@router.get(
    "/{run_id}/prompts",
    response_model=RunPrompts,
    summary="Get a dataset run's prompts",
    responses=error_responses(404, 422),
    openapi_extra=READ,
)
async def get_run_prompts(
    ctx: Ctx,
    run_id: RunId,
    split: Annotated[PromptSplit, Query(description="The training or the held-out prompts.")] = "held_out",
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=100)] = 100,
) -> RunPrompts:
    """The prompts of a run trained on a dataset, by split: `held_out` ones never reached training and are the
    ones to evaluate on. A run of an environment has none (an empty page)."""
    return await run_in_threadpool(service.get_prompts, ctx, run_id, split, offset, limit)


@router.get(
    "/{run_id}/results",
    response_model=RunResults,
    summary="Get a run's results",
    responses=error_responses(404, 422),
    openapi_extra=READ,
)
async def get_run_results(ctx: Ctx, run_id: RunId) -> RunResults:
    """Final metrics, metric history, checkpoints and the trained weights (local directory or tinker:// URI)."""
    return await run_in_threadpool(service.get_results, ctx, run_id)


@router.get(
    "/{run_id}/metrics",
    response_model=RunMetrics,
    summary="Get a run's metrics",
    responses=error_responses(404, 422),
    openapi_extra=READ,
)
async def get_run_metrics(
    ctx: Ctx,
    run_id: RunId,
    name: Annotated[list[str] | None, Query(description="Metric names, e.g. reward/mean; all when absent.")] = None,
    min_step: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
    max_step: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
) -> RunMetrics:
    """`{"metrics": {"reward/mean": [[step, value], ...], ...}}`."""
    return await run_in_threadpool(service.get_metrics, ctx, run_id, name, min_step, max_step)


@logs_router.get(
    "/{run_id}/logs/{process}",
    response_class=PlainTextResponse,
    summary="Read or follow a process's log",
    responses=response(200, "Log lines") | json_error_responses(401, 403, 404, 422),
    openapi_extra=READ,
)
async def get_run_log(
    ctx: Ctx,
    request: Request,
    run_id: RunId,
    process: ProcessRole,
    tail: Annotated[int, Query(ge=0, le=100_000, description="Last lines to return.")] = 200,
    follow: Annotated[bool, Query(description="Keep streaming new lines until the run ends.")] = False,
) -> Response:
    """The last `tail` lines; with `follow=true`, then every new line as it is written, until the run ends."""
    text = await run_in_threadpool(service.log_tail, ctx, run_id, process, tail)
    if not follow:
        return PlainTextResponse(text)
    return StreamingResponse(_follow(ctx, request, run_id, process, text), media_type="text/plain")


async def _follow(ctx: AppContext, request: Request, run_id: str, role: str, first: str) -> AsyncIterator[str]:
    yield first
    path = RunPaths(ctx.settings.data_path, run_id).log(role)
    offset = path.stat().st_size if path.exists() else 0
    pending = b""
    while not await request.is_disconnected():
        chunk, offset = await run_in_threadpool(_read_from, path, offset)
        pending += chunk
        if b"\n" in pending:
            complete, _, pending = pending.rpartition(b"\n")
            yield ctx.scrub(complete.decode("utf-8", errors="replace")) + "\n"
        elif not chunk and await run_in_threadpool(service.is_terminal, ctx, run_id):
            break
        if not chunk:
            await asyncio.sleep(FOLLOW_POLL_S)
    if pending:
        yield ctx.scrub(pending.decode("utf-8", errors="replace"))


def _read_from(path: Path, offset: int) -> tuple[bytes, int]:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read(1 << 20)
    except OSError:
        return b"", offset
    return data, offset + len(data)


@node_router.get("/{run_id}/node/plan", response_model=NodePlan)
async def get_node_plan(ctx: Ctx, run_id: RunId, secret: RunSecret = None) -> NodePlan:
    """The run's plan, once, for the bootstrap secret the job was submitted with (which it spends)."""
    return await run_in_threadpool(node.node_plan, ctx, run_id, secret)


@node_router.post("/{run_id}/node/report", response_model=NodeReportAnswer)
async def post_node_report(ctx: Ctx, run_id: RunId, body: NodeReport, secret: RunSecret = None) -> NodeReportAnswer:
    """Mirrored logs, metrics and trainer state, and the supervisor's events; answers offsets and whether to stop."""
    return await run_in_threadpool(node.node_report, ctx, RunManager.of(ctx).executor, run_id, secret, body)
