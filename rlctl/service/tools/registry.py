"""Tool definitions and invocation, shared by the REST routes and the MCP server.

A tool is a name, a description that tells an agent when to use it, its arguments model (the strict JSON schema
an agent sees is generated from it), hints for MCP clients, its result model (the output schema), and a handler
that adapts one service function. Invocation never raises: bad arguments and service errors come back as results
with an `error` field.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Generic, TypeVar

from fastapi.encoders import jsonable_encoder
from pydantic import BaseModel, ConfigDict, ValidationError

from rlctl.service.auth.scopes import Scope
from rlctl.service.context import AppContext
from rlctl.service.errors import NotFound, ServiceError
from rlctl.service.runs.ratelimit import status_rule
from rlctl.service.schemas import present_paths_in, presenting_paths
from rlctl.service.settings import Settings
from rlctl.service.tools.json_schemas import JsonSchema, output_schema, strict_input_schema, without_default_nulls
from rlctl.service.tools.sessions import SESSION_ARGUMENT, SESSION_ARGUMENT_SCHEMA, SessionState

logger = logging.getLogger("rlctl.tools")

# Fields of an error's details copied to the top level of a tool result: the reference's, and an environment
# write's validation report and current hash.
ERROR_DETAIL_FIELDS = (
    "available",
    "available_fields",
    "locked_value",
    "field",
    "status",
    "run_id",
    "expected",
    "validation",
    "current_hash",
)
STATUS_RULE = "{status_rule}"  # in a description: the status check rule, with the configured interval


class ToolNotFound(NotFound):
    code = "TOOL_NOT_FOUND"


class ToolArguments(BaseModel):
    """Base of every tool's arguments: unknown arguments are refused by name."""

    model_config = ConfigDict(extra="forbid")


class NoArguments(ToolArguments):
    pass


ArgumentsT = TypeVar("ArgumentsT", bound=BaseModel)


@dataclass(frozen=True)
class Hints:
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = False


@dataclass(frozen=True)
class Tool(Generic[ArgumentsT]):
    name: str
    description: str  # STATUS_RULE in it is replaced by the rule with the configured interval
    arguments: type[ArgumentsT]
    result: Any  # the result model, or a union of result models
    handler: Callable[[AppContext, SessionState, ArgumentsT], BaseModel]
    hints: Hints = field(default_factory=Hints)
    scope: Scope | None = None  # the scope a token needs to see and call it; every tool declares one
    stateful: bool = False  # reads or writes the tool session: takes the `tool_session` argument

    def __post_init__(self) -> None:
        if self.scope is None:
            raise TypeError(f"tool {self.name} declares no scope (docs/AUTH.md#scopes)")

    def describe(self, settings: Settings) -> str:
        return self.description.replace(STATUS_RULE, status_rule(settings.status_check_interval_s))

    @cached_property
    def input_schema(self) -> JsonSchema:
        """Strict (OpenAI function calling): every argument listed as required, an optional one nullable."""
        schema = strict_input_schema(self.arguments)
        if self.stateful:
            schema["properties"] = {**schema.get("properties", {}), SESSION_ARGUMENT: SESSION_ARGUMENT_SCHEMA}
            schema["required"] = [*schema.get("required", ()), SESSION_ARGUMENT]
        return schema

    @cached_property
    def mcp_input_schema(self) -> JsonSchema:
        """The same arguments for MCP clients: only those without a default are required (openai-agents refuses
        a call that leaves out one listed as required)."""
        schema = strict_input_schema(self.arguments, relaxed=True)
        if self.stateful:
            schema["properties"] = {**schema.get("properties", {}), SESSION_ARGUMENT: SESSION_ARGUMENT_SCHEMA}
        return schema

    @cached_property
    def output_schema(self) -> JsonSchema:
        return output_schema(self.result)

    def openai_schema(self, settings: Settings) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.describe(settings),
                "parameters": self.input_schema,
                "strict": True,
            },
        }

    def parse(self, arguments: Any) -> ArgumentsT:
        """The arguments as the tool's model, validated as JSON (no coercion of strings to numbers); a null for
        an optional argument means its default. Raises ValidationError."""
        if isinstance(arguments, Mapping):
            if self.stateful:  # the session was resolved from it before the call
                arguments = {k: v for k, v in arguments.items() if k != SESSION_ARGUMENT}
            arguments = without_default_nulls(self.arguments, arguments)
        return self.arguments.model_validate_json(json.dumps(arguments), strict=True)


def invoke(ctx: AppContext, tool: Tool[Any], state: SessionState, arguments: Any) -> dict[str, Any]:
    """Validate the arguments, run the tool, and return its result (errors included) as a JSON object."""
    if not isinstance(arguments, dict):
        return {"error": "arguments must be a JSON object", "code": "VALIDATION_ERROR"}
    try:
        parsed = tool.parse(arguments)
    except ValidationError as error:
        return argument_problem(tool, error)
    try:
        with presenting_paths(ctx.settings):  # MCP calls run outside the request's context
            return tool.handler(ctx, state, parsed).model_dump(mode="json")
    except ServiceError as error:
        # details may hold any value (a locked datetime, a path)
        with presenting_paths(ctx.settings):
            encoded: dict[str, Any] = present_paths_in(jsonable_encoder(error_result(error)))
        return encoded
    except Exception:  # noqa: BLE001 - an agent gets a result, never a 500
        logger.exception("tool %s failed", tool.name)
        return {"error": "internal error while running the tool; see the service log", "code": "INTERNAL_ERROR"}


def argument_problem(tool: Tool[Any], error: ValidationError) -> dict[str, Any]:
    first = error.errors()[0]
    location = [str(part) for part in first["loc"]]
    argument = location[0] if location else "arguments"
    where = ".".join(location)
    return {
        "error": f"argument {argument!r}: {where + ': ' if len(location) > 1 else ''}{first['msg']}",
        "code": "VALIDATION_ERROR",
        "argument": argument,
        "expected": tool.input_schema["properties"].get(argument, {}),
    }


def error_result(error: ServiceError) -> dict[str, Any]:
    result: dict[str, Any] = {"error": error.message, "code": error.code}
    for key in ERROR_DETAIL_FIELDS:
        if key in error.details:
            result[key] = error.details[key]
    return result
