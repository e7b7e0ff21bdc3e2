"""HTTP routes of the environment catalog: thin adapters over service.environments.service."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from service.deps import Ctx
from service.environments import service
from service.environments.schemas import (
    ConfigPreview,
    ConfigPreviewRequest,
    EnvironmentDetail,
    EnvironmentList,
)
from service.names import EnvironmentName
from service.schemas import error_responses
from service.settings import Backend

router = APIRouter(prefix="/environments", tags=["environments"], responses=error_responses(401))


@router.get("", response_model=EnvironmentList, summary="List the environments")
def list_environments(ctx: Ctx) -> EnvironmentList:
    """Every environment class found in the environment directories, and the files that could not be read."""
    return service.list_environments(ctx)


@router.get(
    "/{name}",
    response_model=EnvironmentDetail,
    summary="Describe an environment and its configuration",
    responses=error_responses(404, 422),
)
async def get_environment(
    ctx: Ctx,
    name: EnvironmentName,
    backend: Annotated[Backend | None, Query(description="Backend whose locked values to show.")] = None,
) -> EnvironmentDetail:
    """The environment with its configurable fields (defaults from `config_init()`) and the locked fields."""
    return await run_in_threadpool(service.describe_environment, ctx, name, backend)


@router.post(
    "/{name}/config/preview",
    response_model=ConfigPreview,
    summary="Preview a run's merged configuration",
    responses=error_responses(404, 413, 422),
)
async def preview_environment_config(ctx: Ctx, name: EnvironmentName, body: ConfigPreviewRequest) -> ConfigPreview:
    """Validate edits and show the merged config and YAML a run would get; nothing is stored."""
    return await run_in_threadpool(service.preview_config, ctx, name, body.config, body.backend)
