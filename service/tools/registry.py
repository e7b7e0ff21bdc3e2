"""Tool definitions and invocation, shared by the REST routes and the MCP server.

A tool is a name, a description that tells an agent when to use it, a strict JSON schema for its arguments,
hints for MCP clients, an output schema, and a handler that adapts one service function. Invocation never
raises: bad arguments and service errors come back as results with an `error` field.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from fastapi.encoders import jsonable_encoder

from service.context import AppContext
from service.errors import NotFound, ServiceError
from service.tools.sessions import SessionState

logger = logging.getLogger("rlctl.tools")

# Fields of an error's details that the reference's results carried, copied to the top level.
ERROR_DETAIL_FIELDS = ("available", "available_fields", "locked_value", "field", "status", "run_id", "expected")


class ToolNotFound(NotFound):
    code = "TOOL_NOT_FOUND"


@dataclass(frozen=True)
class Hints:
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = False


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # properties of a strict object schema: every one required, nullable if optional
    handler: Callable[[AppContext, SessionState, dict[str, Any]], dict[str, Any]]
    hints: Hints = field(default_factory=Hints)
    output: dict[str, Any] = field(default_factory=dict)  # properties of the result object

    @property
    def input_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": self.parameters,
            "required": list(self.parameters),
            "additionalProperties": False,
        }

    @property
    def output_schema(self) -> dict[str, Any]:
        # Error results share the object: nothing is required, so both shapes validate.
        properties = {**self.output, "error": {"type": "string"}}
        return {"type": "object", "properties": properties, "additionalProperties": True}

    def openai_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.input_schema,
                "strict": True,
            },
        }


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """An optional argument in a strict schema: required, but null allowed (null means "use the default")."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return {**schema, "type": [kind, "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def invoke(ctx: AppContext, tool: Tool, state: SessionState, arguments: Any) -> dict[str, Any]:
    """Validate the arguments, run the tool, and return its result (errors included) as JSON."""
    problem = argument_problem(tool, arguments)
    if problem is not None:
        return problem
    filled = {name: arguments.get(name) for name in tool.parameters}  # absent optional arguments mean null
    try:
        result = tool.handler(ctx, state, filled)
    except ServiceError as error:
        result = error_result(error)
    except Exception:  # noqa: BLE001 - an agent gets a result, never a 500
        logger.exception("tool %s failed", tool.name)
        result = {"error": "internal error while running the tool; see the service log", "code": "INTERNAL_ERROR"}
    return jsonable_encoder(result)


def argument_problem(tool: Tool, arguments: Any) -> dict[str, Any] | None:
    if not isinstance(arguments, dict):
        return {"error": "arguments must be a JSON object", "code": "VALIDATION_ERROR"}
    # Agents may leave optional (nullable) arguments out; strictness is about types and unknown names.
    lenient = {**tool.input_schema, "required": [n for n, s in tool.parameters.items() if not _allows_null(s)]}
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(lenient).iter_errors(arguments))
    if error is None:
        return None
    argument = error.path[0] if error.path else _named_in(error)
    return {
        "error": f"argument {argument!r}: {error.message}",
        "code": "VALIDATION_ERROR",
        "argument": argument,
        "expected": tool.parameters.get(argument, {}) if isinstance(argument, str) else None,
    }


def error_result(error: ServiceError) -> dict[str, Any]:
    result: dict[str, Any] = {"error": error.message, "code": error.code}
    for key in ERROR_DETAIL_FIELDS:
        if key in error.details:
            result[key] = error.details[key]
    return result


def _allows_null(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if isinstance(kind, list):
        return "null" in kind
    return any(option.get("type") == "null" for option in schema.get("anyOf", []))


def _named_in(error: jsonschema.ValidationError) -> str:
    """The argument a top-level error is about: jsonschema quotes it first in the message of a missing
    ("'run_id' is a required property") or an unexpected ("... ('surprise' was unexpected)") property."""
    if error.validator in ("required", "additionalProperties") and "'" in str(error.message):
        return str(error.message).split("'")[1]
    return "arguments"
