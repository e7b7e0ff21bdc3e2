"""HTTP routes of trajectory datasets: thin adapters over rlctl.service.datasets.service."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from rlctl.service.auth.guard import OPERATE, READ
from rlctl.service.context import AppContext
from rlctl.service.datasets import service
from rlctl.service.datasets.schemas import (
    CompressRequest,
    ContainerName,
    DatasetList,
    DatasetOut,
    DatasetStatsOut,
    ExportFormat,
    FilterRequest,
    GrpoExportRequest,
    MetricsPage,
    OnError,
    Operation,
    RecordsPage,
    ScoreRequest,
    UploadFormat,
    UploadOptions,
)
from rlctl.service.datasets.service import MAX_RECORDS_PAGE
from rlctl.service.datasets.store import UPLOADS
from rlctl.service.deps import Ctx
from rlctl.service.errors import ValidationFailed
from rlctl.service.jobs.schemas import JobOut
from rlctl.service.names import NAME_PATTERN, name_path
from rlctl.service.pagination import DEFAULT_PAGE, PageCursor, PageLimit
from rlctl.service.schemas import error_responses, json_error_responses, link, linked, response
from rlctl.service.settings import Settings

router = APIRouter(prefix="/datasets", tags=["datasets"], responses=error_responses(401, 403))
# Downloads answer JSON Lines; their errors stay JSON, so they are documented apart from the router's.
downloads_router = APIRouter(prefix="/datasets", tags=["datasets"])
DatasetId = Annotated[str, name_path("Dataset id, as returned by POST /datasets or a job's result.")]
ExportId = Annotated[str, name_path("Export id: the `export_id` of an export-grpo job's result.")]
UPLOAD_CHUNK = 1 << 20
JSONL = "application/x-ndjson"

_UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "JSON Lines (one record per line) or one JSON document, as the raw body "
        "(`curl --data-binary @file.jsonl`) or as the multipart field `file`.",
        "content": {
            JSONL: {"schema": {"type": "string", "format": "binary"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {"file": {"type": "string", "format": "binary"}},
                }
            },
        },
    }
}


def body_limit(scope: Scope, settings: Settings) -> int | None:
    """The upload route's own limit (uploads are streamed to disk); None for every other route."""
    if scope.get("method") == "POST" and scope.get("path", "").rstrip("/") == "/datasets":
        return settings.dataset_upload_max_bytes
    return None


@router.post(
    "",
    response_model=DatasetOut,
    status_code=201,
    summary="Upload a dataset",
    responses=linked(
        201,
        "The stored dataset",
        {
            "GetDataset": link("get_dataset", dataset_id="id"),
            "GetRecords": link("get_records", dataset_id="id"),
            "GetStats": link("get_stats", dataset_id="id"),
            "DeleteDataset": link("delete_dataset", dataset_id="id"),
        },
    )
    | error_responses(404, 413, 422),
    openapi_extra=OPERATE | _UPLOAD_BODY,
)
async def upload_dataset(
    ctx: Ctx,
    request: Request,
    name: Annotated[str, Query(pattern=NAME_PATTERN, description="Dataset name (need not be unique).")],
    format: Annotated[UploadFormat, Query(description="Input format; `auto` detects it per record.")] = "auto",
    on_error: Annotated[OnError, Query(description="`fail`: store nothing if any line is bad; `skip`.")] = "fail",
    container: Annotated[ContainerName, Query(description="JSON Lines, one JSON document, or `auto`.")] = "auto",
    tokenizer: Annotated[str | None, Query(pattern=NAME_PATTERN, description="Token counter for stats.")] = None,
) -> DatasetOut:
    """One record per line: OpenAI chat (`{"messages": [...]}`), ShareGPT (`{"conversations": [...]}`) or an
    agent-log format; other keys of a line become the record's metadata (`answer`, `task_id`, `reward`, ...).
    Single JSON documents (tau-bench arrays, SWE-agent `.traj`) upload too. Every bad line is reported with its
    line number (422 INVALID_RECORDS) and nothing is stored, unless `on_error=skip`. The body is streamed to
    disk (limit `RLCTL_DATASET_UPLOAD_MAX_BYTES`), never held in memory."""
    options = UploadOptions(name=name, format=format, on_error=on_error, container=container, tokenizer=tokenizer)
    upload = await _receive_upload(ctx, request)
    try:
        return await run_in_threadpool(service.upload_dataset, ctx, options, upload)
    finally:
        upload.close()


@router.get("", response_model=DatasetList, summary="List datasets", responses=error_responses(422), openapi_extra=READ)
async def list_datasets(
    ctx: Ctx,
    name: Annotated[str | None, Query(pattern=NAME_PATTERN, description="Only datasets with this name.")] = None,
    operation: Annotated[Operation | None, Query(description="Only datasets made by this operation.")] = None,
    parent_id: Annotated[str | None, Query(pattern=NAME_PATTERN, description="Only datasets derived from it.")] = None,
    limit: PageLimit = DEFAULT_PAGE,
    cursor: PageCursor = None,
) -> DatasetList:
    """Newest first."""
    return await run_in_threadpool(service.list_datasets, ctx, name, operation, parent_id, limit, cursor)


@router.get(
    "/{dataset_id}",
    response_model=DatasetOut,
    summary="Get a dataset",
    responses=error_responses(404, 422),
    openapi_extra=READ,
)
async def get_dataset(ctx: Ctx, dataset_id: DatasetId) -> DatasetOut:
    """Counts, lineage (parent, operation, parameters) and the operation's report."""
    return await run_in_threadpool(service.get_dataset_with_lineage, ctx, dataset_id)


@router.delete(
    "/{dataset_id}",
    status_code=204,
    summary="Delete a dataset",
    responses=error_responses(404, 409, 422),
    openapi_extra=OPERATE,
)
async def delete_dataset(ctx: Ctx, dataset_id: DatasetId) -> Response:
    """Removes the dataset and its files; datasets derived from it keep their `parent_id`. 409 while a job
    still reads it."""
    await run_in_threadpool(service.delete_dataset, ctx, dataset_id)
    return Response(status_code=204)


@router.get(
    "/{dataset_id}/records",
    response_model=RecordsPage,
    summary="Page through records",
    responses=error_responses(404, 422),
    openapi_extra=READ,
)
async def get_records(
    ctx: Ctx,
    dataset_id: DatasetId,
    offset: Annotated[int, Query(ge=0, le=1_000_000_000, description="Index of the first record.")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_RECORDS_PAGE)] = 20,
) -> RecordsPage:
    """Records `offset` … `offset + limit − 1` in stored order; `next_offset` is null on the last page."""
    return await run_in_threadpool(service.read_records, ctx, dataset_id, offset, limit)


@router.get(
    "/{dataset_id}/stats",
    response_model=DatasetStatsOut,
    summary="Dataset statistics",
    responses=error_responses(404, 422),
    openapi_extra=READ,
)
async def get_stats(ctx: Ctx, dataset_id: DatasetId) -> DatasetStatsOut:
    """Tool calls with success and failure rates, reasoning coverage, completion rate, API calls, token and
    turn distributions, source formats and rewards; computed while the dataset was written."""
    return await run_in_threadpool(service.dataset_stats, ctx, dataset_id)


@router.get(
    "/{dataset_id}/compression-metrics",
    response_model=MetricsPage,
    summary="Per-record compression metrics",
    responses=error_responses(404, 422),
    openapi_extra=READ,
)
async def get_compression_metrics(
    ctx: Ctx,
    dataset_id: DatasetId,
    offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
    limit: PageLimit = 100,
) -> MetricsPage:
    """For a dataset made by compress: tokens before and after, ratio, turns removed, still over limit,
    summarisation calls and errors, per record (empty for other datasets)."""
    return await run_in_threadpool(service.read_compression_metrics, ctx, dataset_id, offset, limit)


@downloads_router.get(
    "/{dataset_id}/export",
    summary="Download the records",
    response_class=StreamingResponse,
    responses=response(200, "JSON Lines: one record per line", media_type=JSONL)
    | json_error_responses(401, 403, 404, 422),
    openapi_extra=READ,
)
async def export_dataset(
    ctx: Ctx,
    dataset_id: DatasetId,
    format: Annotated[ExportFormat, Query(description="`rlctl` (re-importable as is) or plain `sharegpt`.")] = "rlctl",
) -> StreamingResponse:
    """Streams every record as one JSON line, in stored order."""
    chunks = await run_in_threadpool(service.export_dataset, ctx, dataset_id, format)
    filename = f"{dataset_id}.{format}.jsonl"
    headers = {"Content-Disposition": f'attachment; filename="{filename}"'}
    return StreamingResponse(chunks, media_type=JSONL, headers=headers)


@downloads_router.get(
    "/{dataset_id}/exports/{export_id}",
    summary="Download a GRPO export",
    response_class=FileResponse,
    responses=response(200, "JSON Lines, one group per line", media_type=JSONL)
    | json_error_responses(401, 403, 404, 422),
    openapi_extra=READ,
)
async def download_export(ctx: Ctx, dataset_id: DatasetId, export_id: ExportId) -> FileResponse:
    """One line per prompt group: prompt, rewards, advantages and the group's trajectories."""
    path = await run_in_threadpool(service.export_file, ctx, dataset_id, export_id)
    return FileResponse(path, media_type=JSONL, filename=f"{dataset_id}-grpo-{export_id}.jsonl")


@router.post(
    "/{dataset_id}/filter",
    response_model=JobOut,
    status_code=202,
    summary="Filter into a derived dataset",
    responses=error_responses(404, 413, 422),
    openapi_extra=OPERATE,
)
async def filter_dataset(ctx: Ctx, dataset_id: DatasetId, body: FilterRequest) -> JobOut:
    """Drops records without reasoning, incomplete ones, ones calling tools outside `allowed_tools`, and ones
    outside the token bounds. Answers the job; its result names the derived dataset and the drop reasons."""
    return await run_in_threadpool(service.start_filter, ctx, dataset_id, body)


@router.post(
    "/{dataset_id}/compress",
    response_model=JobOut,
    status_code=202,
    summary="Compress into a derived dataset",
    responses=error_responses(404, 409, 413, 422),
    openapi_extra=OPERATE,
)
async def compress_dataset(ctx: Ctx, dataset_id: DatasetId, body: CompressRequest) -> JobOut:
    """Brings each record under `target_max_tokens` (15250) by summarising as little of its middle as needed
    (≤ `summary_target_tokens`, 750), protecting the first system, human, gpt and tool turns and the last 4.
    A record whose summary fails keeps its original form and is counted. Answers the job; its result has the
    aggregate metrics, per-record ones are at /datasets/{id}/compression-metrics."""
    return await run_in_threadpool(service.start_compression, ctx, dataset_id, body)


@router.post(
    "/{dataset_id}/score",
    response_model=JobOut,
    status_code=202,
    summary="Score into a derived dataset",
    responses=error_responses(404, 413, 422),
    openapi_extra=OPERATE,
)
async def score_dataset(ctx: Ctx, dataset_id: DatasetId, body: ScoreRequest) -> JobOut:
    """Weighted reward functions: `correctness` (2.0 when the record's `answer_field` is in the final answer),
    `format` (0.25 for <think>, 0.25 for <tool_call>), `source_reward`, or an environment's scorer by name
    (e.g. `gsm8k`, run in a child process). Records get `reward` and `reward_breakdown`."""
    return await run_in_threadpool(service.start_scoring, ctx, dataset_id, body)


@router.post(
    "/{dataset_id}/export-grpo",
    response_model=JobOut,
    status_code=202,
    summary="Export for GRPO",
    responses=error_responses(404, 413, 422),
    openapi_extra=OPERATE,
)
async def export_grpo(ctx: Ctx, dataset_id: DatasetId, body: GrpoExportRequest) -> JobOut:
    """Groups scored records by prompt with their rewards and group-relative advantages (sorted on disk).
    Groups too small, records without a reward or a prompt are reported in the job's result, never silently
    kept. Download from the result's `download` path."""
    return await run_in_threadpool(service.start_grpo_export, ctx, dataset_id, body)


# --- receiving an upload without holding it in memory ---


class _Upload:
    """A seekable binary file of the upload (spooled to disk), closed and removed after the import."""

    def __init__(self, handle: IO[bytes], path: str | None = None) -> None:
        self.handle = handle
        self.path = path

    def read(self, size: int = -1) -> bytes:
        return self.handle.read(size)

    def readline(self, size: int = -1) -> bytes:
        return self.handle.readline(size)

    def tell(self) -> int:
        return self.handle.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.handle.seek(offset, whence)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.handle)

    def close(self) -> None:
        self.handle.close()
        if self.path is not None:
            Path(self.path).unlink(missing_ok=True)


async def _receive_upload(ctx: AppContext, request: Request) -> _Upload:
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        try:
            form = await request.form(max_files=1, max_fields=8)
        except StarletteHTTPException as error:  # malformed multipart, too many parts
            raise ValidationFailed(f"the multipart body cannot be read: {error.detail}") from None
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            await form.close()
            raise ValidationFailed("a multipart upload needs its file in the field 'file'", {"field": "file"})
        upload.file.seek(0)
        return _Upload(upload.file)
    spool = ctx.settings.data_path / "datasets" / UPLOADS
    spool.mkdir(parents=True, exist_ok=True)
    descriptor, path = tempfile.mkstemp(prefix="upload-", dir=spool)
    handle = os.fdopen(descriptor, "w+b")
    try:
        async for chunk in request.stream():
            handle.write(chunk)
        handle.flush()
        handle.seek(0)
    except BaseException:
        handle.close()
        os.unlink(path)
        raise
    return _Upload(handle, path)
