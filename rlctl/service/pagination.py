"""Keyset pagination, newest first: cursors are `{created_at in µs since the epoch}-{id}`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Generic, TypeVar

from fastapi import Query
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from sqlalchemy import Integer, Select, and_, bindparam, or_
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import BindParameter

from rlctl.service.errors import ValidationFailed

CURSOR_PATTERN = r"^[0-9]{1,16}-[A-Za-z0-9_-]{1,128}$"
MAX_PAGE = 200
DEFAULT_PAGE = 50

# The query parameters of every keyset-paged listing.
PageLimit = Annotated[int, Query(ge=1, le=MAX_PAGE)]
PageCursor = Annotated[str | None, Query(pattern=CURSOR_PATTERN, description="`next_cursor` of the page before.")]

RowT = TypeVar("RowT")
ModelT = TypeVar("ModelT", bound=BaseModel)
ItemT = TypeVar("ItemT")


def encode_cursor(created_at: datetime, item_id: str) -> str:
    return f"{int(created_at.timestamp() * 1_000_000)}-{item_id}"


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    micros, separator, item_id = cursor.partition("-")
    if not separator or not micros.isdigit() or len(micros) > 16 or not item_id:
        raise ValidationFailed("invalid cursor: pass next_cursor of the previous page", {"field": "cursor"})
    return datetime.fromtimestamp(int(micros) / 1_000_000, UTC), item_id


def newest_first_statement(query: Select[*tuple[Any, ...]], model: Any, after_cursor: bool) -> Select[*tuple[Any, ...]]:
    """`query` over `model` (with `created_at` and `id`) newest first, one page and one row more (to tell whether
    a next page exists), with its values as bound parameters (`page_parameters`): after the cursor's row when
    `after_cursor`. Built once for each shape of a listing and reused, a statement is compiled once: SQLAlchemy
    finds it in its cache by a key it computes once per statement object, not once per request."""
    if after_cursor:
        after_created_at: BindParameter[Any] = bindparam("after_created_at")
        after_id: BindParameter[Any] = bindparam("after_id")
        query = query.where(
            or_(model.created_at < after_created_at, and_(model.created_at == after_created_at, model.id < after_id))
        )
    return query.order_by(model.created_at.desc(), model.id.desc()).limit(bindparam("page_rows", type_=Integer))


def page_parameters(limit: int, cursor: str | None) -> dict[str, Any]:
    """The bound values of a `newest_first_statement` (its `after_cursor` is `bool(cursor)`)."""
    parameters: dict[str, Any] = {"page_rows": limit + 1}
    if cursor:
        parameters["after_created_at"], parameters["after_id"] = decode_cursor(cursor)
    return parameters


def split_page(rows: Sequence[RowT], limit: int) -> tuple[Sequence[RowT], str | None]:
    """A `newest_first_statement`'s rows (with `created_at` and `id`) as the page and the next page's cursor."""
    page = rows[:limit]
    last: Any = page[-1] if len(rows) > limit else None
    return page, None if last is None else encode_cursor(last.created_at, last.id)


def newest_first_page(
    session: Session,
    query: Select[*tuple[Any, ...]],
    model: Any,
    limit: int,
    cursor: str | None,
    to_record: Callable[[RowT], ItemT],
) -> tuple[list[ItemT], str | None]:
    """One page of `query` over `model` (with `created_at` and `id`), and the cursor of the next page (or None).
    `limit` is the caller's, within 1..MAX_PAGE (the routes' PageLimit). Either `model` is a mapped class and
    `query` selects it (rows are its objects), or `model` is a table's columns (`Model.__table__.c`) and `query`
    selects some of them, `created_at` and `id` among them (rows are tuples with those names): a listing loads
    only the columns it returns, as plain SQL."""
    parameters = page_parameters(limit, cursor)
    result = session.execute(newest_first_statement(query, model, bool(cursor)), parameters)
    # Told by `model`, not by the statement's column descriptions: working those out cost a third of a page.
    rows: list[Any] = list(result.scalars().all() if isinstance(model, type) else result.all())
    page, next_cursor = split_page(rows, limit)
    return [to_record(row) for row in page], next_cursor


class QueryModel(Generic[ModelT]):
    """A route's query parameters as one pydantic model, read by the route itself (`read`) and documented as
    FastAPI documents declared parameters (`parameters`, for the route's `openapi_extra`).

    For GET /runs alone: FastAPI's reading of five declared parameters was a sixth of that page's CPU (0.034 of
    0.20 ms, benchmarks/read_cpu.py), and its throughput under 200 connections stayed under half of /healthz's
    (benchmarks/runs.py). Deleted, the parameters declared again, when FastAPI reads them for less or the goal
    goes."""

    def __init__(self, model: type[ModelT]) -> None:
        self.model = model

    def read(self, query: Mapping[str, str]) -> ModelT:
        """The parameters (each the last of its name, unknown names ignored, as FastAPI reads them); a value that
        does not fit is the same 422 as FastAPI's, each error located in the query."""
        try:
            return self.model.model_validate(dict(query))
        except ValidationError as invalid:
            errors = [error | {"loc": ("query", *error["loc"])} for error in invalid.errors(include_url=False)]
            raise RequestValidationError(errors) from None

    def parameters(self) -> list[dict[str, Any]]:
        """The OpenAPI parameter objects of the model's fields, as FastAPI writes declared ones."""
        schema = self.model.model_json_schema(ref_template="#/components/schemas/{model}")
        required = set(schema.get("required", ()))
        documented = []
        for name, field in schema["properties"].items():
            if field.get("default", 0) is None:
                field = {key: value for key, value in field.items() if key != "default"}
            field.setdefault("title", name.replace("_", " ").title())  # pydantic leaves it out beside a $ref
            parameter = {"name": name, "in": "query", "required": name in required, "schema": field}
            if "description" in field:
                parameter["description"] = field["description"]
            documented.append(parameter)
        return documented
