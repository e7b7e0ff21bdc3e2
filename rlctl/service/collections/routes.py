"""HTTP routes of collections (the batch runner): thin adapters over rlctl.service.collections.service."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool
from starlette.types import Scope

from rlctl.service.auth.guard import OPERATE, READ
from rlctl.service.collections import service
from rlctl.service.collections.schemas import (
    CollectionItemsPage,
    CollectionList,
    CollectionOut,
    CollectionStatus,
    CreateCollectionRequest,
    ItemStatus,
)
from rlctl.service.deps import Ctx
from rlctl.service.names import name_path
from rlctl.service.pagination import DEFAULT_PAGE, PageCursor, PageLimit
from rlctl.service.schemas import error_responses, link, linked
from rlctl.service.settings import Settings

router = APIRouter(prefix="/collections", tags=["collections"], responses=error_responses(401, 403))
CollectionId = Annotated[str, name_path("Collection id, as returned by POST /collections.")]


def body_limit(scope: Scope, settings: Settings) -> int | None:
    """Prompts travel in the request body: this route gets its own (larger) limit."""
    if scope.get("method") == "POST" and scope.get("path", "").rstrip("/") == "/collections":
        return settings.collection_max_body_bytes
    return None


@router.post(
    "",
    response_model=CollectionOut,
    status_code=202,
    summary="Collect trajectories (batch runner)",
    responses=linked(
        202,
        "The accepted collection",
        {
            "GetCollection": link("get_collection", collection_id="id"),
            "ListCollectionItems": link("list_collection_items", collection_id="id"),
            "GetJob": link("get_job", job_id="job_id"),
        },
    )
    | error_responses(404, 409, 413, 422),  # 404: a `model` naming a run that does not exist
    openapi_extra=OPERATE,
)
async def create_collection(ctx: Ctx, body: CreateCollectionRequest) -> CollectionOut:
    """Runs an OpenAI-compatible chat model with tools over the prompts, `runs_per_prompt` times each, with
    bounded concurrency; each trajectory's tools work in its own sandbox directory. Progress is visible at
    GET /collections/{id}; cancel with POST /collections/{id}/cancel and continue with .../resume (by prompt
    and run index: nothing is run twice, nothing is lost). When done, `dataset_id` names the dataset."""
    return await run_in_threadpool(service.create_collection, ctx, body)


@router.get(
    "", response_model=CollectionList, summary="List collections", responses=error_responses(422), openapi_extra=READ
)
async def list_collections(
    ctx: Ctx,
    status: Annotated[CollectionStatus | None, Query(description="Only collections in this state.")] = None,
    limit: PageLimit = DEFAULT_PAGE,
    cursor: PageCursor = None,
) -> CollectionList:
    """Newest first."""
    return await run_in_threadpool(service.list_collections, ctx, status, limit, cursor)


@router.get(
    "/{collection_id}",
    response_model=CollectionOut,
    summary="Get a collection",
    responses=error_responses(404, 422),
    openapi_extra=READ,
)
async def get_collection(ctx: Ctx, collection_id: CollectionId) -> CollectionOut:
    """Status, progress (kept, discarded, failed, pending), the job and, once completed, the dataset."""
    return await run_in_threadpool(service.get_collection, ctx, collection_id)


@router.get(
    "/{collection_id}/items",
    response_model=CollectionItemsPage,
    summary="List a collection's recorded items",
    responses=error_responses(404, 422),
    openapi_extra=READ,
)
async def list_collection_items(
    ctx: Ctx,
    collection_id: CollectionId,
    status: Annotated[ItemStatus | None, Query(description="Only items with this outcome.")] = None,
    offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
    limit: PageLimit = 100,
) -> CollectionItemsPage:
    """One entry per (prompt index, run index) pair that has an outcome, in that order."""
    return await run_in_threadpool(service.list_items, ctx, collection_id, status, offset, limit)


@router.post(
    "/{collection_id}/cancel",
    response_model=CollectionOut,
    summary="Cancel a collection",
    responses=error_responses(404, 409, 422),
    openapi_extra=OPERATE,
)
async def cancel_collection(ctx: Ctx, collection_id: CollectionId) -> CollectionOut:
    """Stops starting trajectories; running ones stop at their next turn and stay pending. 409 when not running."""
    return await run_in_threadpool(service.cancel_collection, ctx, collection_id)


@router.post(
    "/{collection_id}/resume",
    response_model=CollectionOut,
    status_code=202,
    summary="Resume a collection",
    responses=error_responses(404, 409, 422),
    openapi_extra=OPERATE,
)
async def resume_collection(ctx: Ctx, collection_id: CollectionId) -> CollectionOut:
    """Runs every pair without a kept or discarded outcome (failed ones again). 409 unless cancelled or failed."""
    return await run_in_threadpool(service.resume_collection, ctx, collection_id)
