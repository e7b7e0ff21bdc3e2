"""HTTP routes of the environment catalog: thin adapters over rlctl.service.environments.service."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from starlette.concurrency import run_in_threadpool

from rlctl.service.auth.guard import ADMIN, READ
from rlctl.service.deps import Ctx
from rlctl.service.environments import authoring, service
from rlctl.service.environments.schemas import (
    ConfigPreview,
    ConfigPreviewRequest,
    EnvironmentDeleted,
    EnvironmentDetail,
    EnvironmentList,
    EnvironmentSource,
    EnvironmentVersions,
    EnvironmentWritten,
    RollbackRequest,
    WriteEnvironmentRequest,
)
from rlctl.service.names import EnvironmentName
from rlctl.service.schemas import error_responses, link, linked
from rlctl.service.settings import Backend

router = APIRouter(prefix="/environments", tags=["environments"], responses=error_responses(401, 403))
# What a written environment leads to: its source, its versions and its description, by the name answered.
_WRITTEN_LINKS = {
    "GetEnvironmentSource": link("get_environment_source", name="name"),
    "ListEnvironmentVersions": link("list_environment_versions", name="name"),
    "GetEnvironment": link("get_environment", name="name"),
}


@router.get("", response_model=EnvironmentList, summary="List the environments", openapi_extra=READ)
def list_environments(ctx: Ctx) -> EnvironmentList:
    """Every environment class found in the environment directories, and the files that could not be read."""
    return service.list_environments(ctx)


@router.get(
    "/{name}",
    response_model=EnvironmentDetail,
    summary="Describe an environment and its configuration",
    responses=error_responses(404, 422),
    openapi_extra=READ,
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
    openapi_extra=READ,
)
async def preview_environment_config(ctx: Ctx, name: EnvironmentName, body: ConfigPreviewRequest) -> ConfigPreview:
    """Validate edits and show the merged config and YAML a run would get; nothing is stored."""
    return await run_in_threadpool(service.preview_config, ctx, name, body.config, body.backend)


IfMatch = Annotated[
    str | None,
    Header(
        alias="If-Match",
        max_length=200,
        description="The hash (ETag) of the version the change is based on; `*`: it must exist. Else 412.",
    ),
]


@router.get(
    "/{name}/source",
    response_model=EnvironmentSource,
    summary="Read an environment's source",
    responses=error_responses(404, 422),
    openapi_extra=READ,
)
async def get_environment_source(ctx: Ctx, name: EnvironmentName, response: Response) -> EnvironmentSource:
    """The file's source and its SHA-256 (also the ETag), shipped or managed."""
    source = await run_in_threadpool(authoring.read_source, ctx, name)
    response.headers["ETag"] = f'"{source.hash}"'
    return source


@router.put(
    "/{name}",
    response_model=EnvironmentWritten,
    summary="Create or replace a managed environment",
    responses=linked(200, "Replaced", _WRITTEN_LINKS)
    | linked(201, "Created", _WRITTEN_LINKS, model=EnvironmentWritten)
    | error_responses(404, 412, 413, 422),
    openapi_extra=ADMIN,
)
async def put_environment(
    ctx: Ctx, name: EnvironmentName, body: WriteEnvironmentRequest, response: Response, if_match: IfMatch = None
) -> EnvironmentWritten:
    """Stored only after validation (parse, one BaseEnv subclass with this name, no clash with a shipped
    environment, the config import in a child process); a failure is 422 `ENVIRONMENT_INVALID` with the
    checks in `details.validation`. 201 when created, 200 when replaced. The code runs with the service's
    privileges: admin scope only."""
    written = await run_in_threadpool(authoring.write_environment, ctx, name, body, if_match)
    response.status_code = 201 if written.created else 200
    response.headers["ETag"] = f'"{written.hash}"'
    return written


@router.get(
    "/{name}/versions",
    response_model=EnvironmentVersions,
    summary="List a managed environment's versions",
    responses=error_responses(404, 422),
    openapi_extra=READ,
)
async def list_environment_versions(ctx: Ctx, name: EnvironmentName) -> EnvironmentVersions:
    """Every version written through the API, oldest first; `current` marks the live one."""
    return await run_in_threadpool(authoring.list_versions, ctx, name)


@router.post(
    "/{name}/rollback",
    response_model=EnvironmentWritten,
    summary="Roll a managed environment back to an earlier version",
    responses=error_responses(404, 412, 422),
    openapi_extra=ADMIN,
)
async def rollback_environment(
    ctx: Ctx, name: EnvironmentName, body: RollbackRequest, response: Response, if_match: IfMatch = None
) -> EnvironmentWritten:
    """The chosen version's source becomes current as a new version, after the same validation as a write."""
    written = await run_in_threadpool(authoring.rollback_environment, ctx, name, body, if_match)
    response.headers["ETag"] = f'"{written.hash}"'
    return written


@router.delete(
    "/{name}",
    response_model=EnvironmentDeleted,
    summary="Delete a managed environment",
    responses=error_responses(404, 409, 412, 422),
    openapi_extra=ADMIN,
)
async def delete_environment(ctx: Ctx, name: EnvironmentName, if_match: IfMatch = None) -> EnvironmentDeleted:
    """Removes an environment written through the API (its versions stay for a rollback). 409
    `ENVIRONMENT_NOT_MANAGED` for a shipped one, 409 `ENVIRONMENT_IN_USE` while an active run uses it."""
    return await run_in_threadpool(authoring.delete_environment, ctx, name, if_match)
