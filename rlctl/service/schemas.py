"""Response and request models shared by every domain."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. RUN_NOT_FOUND.")
    message: str
    details: dict[str, Any] = Field(default_factory=dict)
    request_id: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


Responses = dict[int | str, dict[str, Any]]  # a route's `responses=`: OpenAPI entries by status


def response(status: int, description: str, *, model: type[BaseModel] | None = None, media_type: str = "") -> Responses:
    """One documented response other than the route's success model (its body's model, or its media type)."""
    entry: dict[str, Any] = {"description": description}
    if model is not None:
        entry["model"] = model
    if media_type:
        # A schema for every body, so generated clients can read it: text (JSON Lines are text, a line each).
        text = {"type": "string", "contentMediaType": media_type}
        entry["content"] = {media_type: {"schema": text}}
    return {status: entry}


def link(operation_id: str, **parameters: str) -> dict[str, Any]:
    """An OpenAPI link to the operation `operation_id` (a route's function name), whose parameters take fields of
    this response's body: `link("get_run", run_id="id")` says GET /runs/{run_id} takes the `id` answered here."""
    values = {name: f"$response.body#/{field}" for name, field in parameters.items()}
    return {"operationId": operation_id, "parameters": values}


def linked(
    status: int, description: str, links: dict[str, dict[str, Any]], *, model: type[BaseModel] | None = None
) -> Responses:
    """A success response documented with the operations its body leads to (clients and the stateful fuzz test
    follow them: create, then read, list, stop or delete what was created). `model` only for a status other than
    the route's own (whose body is its response model already)."""
    entry: dict[str, Any] = {"description": description, "links": links}
    if model is not None:
        entry["model"] = model
    return {status: entry}


def error_responses(*status_codes: int) -> Responses:
    """OpenAPI entries for the error statuses a route documents (all share the one error body)."""
    return {code: {"model": ErrorBody, "description": _DESCRIPTIONS[code]} for code in status_codes}


def json_error_responses(*status_codes: int) -> Responses:
    """The same, for routes whose success is not JSON (their errors still are)."""
    schema = {"$ref": "#/components/schemas/ErrorBody"}
    return {
        code: {"description": _DESCRIPTIONS[code], "content": {"application/json": {"schema": schema}}}
        for code in status_codes
    }


_DESCRIPTIONS = {
    400: "Bad request",
    401: "Missing or wrong bearer token",
    403: "The token lacks the scope this needs (INSUFFICIENT_SCOPE)",
    404: "Not found",
    409: "Conflict with the current state",
    412: "If-Match names another version than the current one",
    413: "Request body too large",
    422: "Invalid input",
    429: "Rate limited",
    503: "Not ready",
}


class CheckpointRef(BaseModel):
    """A run's checkpoint, as lineage: which run and step a record's model was."""

    run_id: str
    step: int
