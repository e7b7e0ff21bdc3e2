"""HTTP routes of the agent tools: thin adapters over rlctl.service.tools.service."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from rlctl.service.auth.guard import READ, CurrentPrincipal
from rlctl.service.auth.tokens import Principal
from rlctl.service.deps import Ctx
from rlctl.service.names import NAME_PATTERN, name_path
from rlctl.service.schemas import error_responses
from rlctl.service.tools import service

router = APIRouter(prefix="/tools", tags=["tools"], responses=error_responses(401, 403))
ToolName = Annotated[str, name_path("Tool name, as listed by GET /tools.")]
SessionHeader = Annotated[
    str | None,
    Header(
        alias="X-Tool-Session",
        pattern=NAME_PATTERN,
        description="The agent's tool session (selected environment, pending config), this token's own. A tool's "
        "`tool_session` argument names one too and wins; neither: the token's `default` session.",
    ),
]


class ToolList(BaseModel):
    tools: list[dict[str, Any]] = Field(description="OpenAI function-calling schemas (strict).")
    count: int


@router.get("", response_model=ToolList, summary="List the agent tools", openapi_extra=READ)
def list_tools(ctx: Ctx, principal: Annotated[Principal, CurrentPrincipal]) -> ToolList:
    """Function-calling schemas of every tool the token may call, for an agent's `tools=` parameter."""
    tools = service.list_tools(ctx, principal)
    return ToolList(tools=tools, count=len(tools))


@router.post(
    "/{name}",
    response_model=dict[str, Any],
    summary="Call an agent tool",
    responses=error_responses(404, 413, 422),
    openapi_extra=READ,
)
async def call_tool(
    ctx: Ctx,
    name: ToolName,
    arguments: Annotated[dict[str, Any], Body(description="The tool's arguments object.")],
    response: Response,
    principal: Annotated[Principal, CurrentPrincipal],
    x_tool_session: SessionHeader = None,
) -> dict[str, Any]:
    """Run one tool. Tool errors (bad arguments, unknown run, locked field, ...) are results with an `error`
    field, not HTTP errors; an unknown tool name is a 404, a tool the token lacks the scope of a 403. The tool
    session the call ran in is named in the X-Tool-Session response header."""
    call = await run_in_threadpool(service.call_tool, ctx, name, arguments, x_tool_session, principal)
    response.headers["X-Tool-Session"] = call.session
    return call.result
