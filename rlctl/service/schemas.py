"""Response and request models shared by every domain."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

from pydantic import BaseModel, Field, PlainSerializer

from rlctl.service.settings import Settings


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


# --- paths in responses (docs/SECURITY.md#paths-in-responses) ---
# Paths are stored absolute (runs, tools and the CLI's tests read them); a response shows each one relative to the
# root it lies under, so no caller learns the server's filesystem layout. The roots are the request's (set by
# `presenting_paths` around every HTTP request and tool call); outside one (a job storing its result), paths stay.
_PATH_ROOTS: ContextVar[tuple[tuple[str, str], ...] | None] = ContextVar("rlctl_path_roots", default=None)


def path_roots(settings: Settings) -> tuple[tuple[str, str], ...]:
    """(absolute root, shown prefix), most specific first: the data directory shows as '' (runs/<id>/...), an
    environment directory by its name (environments/gsm8k.py)."""
    return _roots(settings.data_path, tuple(settings.environment_directories))


@functools.lru_cache(maxsize=16)
def _roots(data_path: Path, environment_directories: tuple[Path, ...]) -> tuple[tuple[str, str], ...]:
    """path_roots, worked out once per set of directories (every request asks)."""
    outside = (d for d in environment_directories if not d.is_relative_to(data_path))
    return ((str(data_path), ""), *((str(d), d.name) for d in outside))


def shown_roots() -> tuple[tuple[str, str], ...] | None:
    """The roots paths are shown relative to now (None: outside a request, paths stay as they are)."""
    return _PATH_ROOTS.get()


@contextmanager
def presenting_paths(settings: Settings) -> Iterator[None]:
    token = _PATH_ROOTS.set(path_roots(settings))
    try:
        yield
    finally:
        _PATH_ROOTS.reset(token)


def _under_root(text: str, roots: tuple[tuple[str, str], ...]) -> str | None:
    for root, prefix in roots:
        if text == root or text.startswith(root.rstrip("/") + "/"):
            rest = text[len(root) :].lstrip("/")
            return "/".join(p for p in (prefix, rest) if p) or "."
    return None


def present_path(value: str | None) -> str | None:
    """An absolute server path as a response shows it: relative to its root, or its last part when it lies under
    none (a setting's directory outside the data directory)."""
    roots = _PATH_ROOTS.get()
    if value is None or roots is None or not value.startswith("/"):
        return value
    return _under_root(value, roots) or PurePosixPath(value).name


@functools.lru_cache(maxsize=16)
def _replacements(roots: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str, str, str], ...]:
    """Per root: (root, what the root alone shows as, the root as a directory in a text, what that shows as)."""
    return tuple(
        (root, prefix or ".", root.rstrip("/") + "/", f"{prefix}/" if prefix else "") for root, prefix in roots
    )


def _relative_text(text: str, roots: tuple[tuple[str, str], ...]) -> str:
    if "/" not in text:  # most strings of a run's config (a run's record shows it whole) name no path
        return text
    for root, alone, directory, shown in _replacements(roots):
        if text == root:
            return alone
        text = text.replace(directory, shown)
    return text


def present_paths_in(value: Any) -> Any:
    """Text or free-form JSON (a command, a job's result, a checkpoint's record) with each server path in its
    strings shown relative to its root; the rest of the text stays as it is."""
    roots = _PATH_ROOTS.get()
    if roots is None:
        return value
    if isinstance(value, str):
        return _relative_text(value, roots)
    if isinstance(value, dict):
        return {k: present_paths_in(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [present_paths_in(v) for v in value]
    return value


# A field holding a server path; JSON holding some (free-form objects whose strings may be paths).
ServerPath = Annotated[str, PlainSerializer(present_path, return_type=str)]
ServerText = Annotated[str, PlainSerializer(present_paths_in, return_type=str)]  # a command naming a path
ServerPaths = Annotated[dict[str, str], PlainSerializer(present_paths_in, return_type=dict[str, str])]
ServerJson = Annotated[dict[str, Any], PlainSerializer(present_paths_in, return_type=dict[str, Any])]
ServerValue = Annotated[Any, PlainSerializer(present_paths_in)]  # a config value: a locked tokenizer directory
ServerJsonList = Annotated[list[dict[str, Any]], PlainSerializer(present_paths_in, return_type=list[dict[str, Any]])]
