"""JSON built by the database, in the text pydantic would write, on SQLite and PostgreSQL alike.

For the hottest listing (a page of runs) the service sends the database's JSON as it is: reading each row into
Python values, validating them and writing them out again was most of such a page's time. These constructs write
a row as one JSON object whose text means what the page's pydantic model writes for the same row (keys in the
model's order, the same value types and datetime text); a test holds the two to that, on both engines.

Part of the second read path of runs' two hottest reads: kept by measurement, and deleted when the ordinary path
meets their goals, as rlctl/service/db/plans.py says (figures and condition).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Boolean, Text, literal_column
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement

from rlctl.service.db.types import UTCDateTime


class json_object(FunctionElement[str]):  # noqa: N801 - named as the SQL function it is
    """`json_object(key, value, ...)`: one JSON object, its keys in the order given."""

    type = Text()
    inherit_cache = True
    as_text = True  # PostgreSQL: its text (json_array_agg nests the json value itself)

    def __init__(self, pairs: dict[str, ColumnElement[Any]]) -> None:
        # Keys are the service's own field names (never input), so they are SQL string literals, not parameters.
        flat = [item for key, value in pairs.items() for item in (literal_column(f"'{_field_name(key)}'"), value)]
        super().__init__(*flat)


class _json_value_object(json_object):  # noqa: N801
    as_text = False
    inherit_cache = True


class json_array_agg(FunctionElement[str]):  # noqa: N801
    """An aggregate: the group's rows as one JSON array of objects (`json_object`'s), in no set order; NULL on
    PostgreSQL and `[]` on SQLite for no rows."""

    type = Text()
    inherit_cache = True

    def __init__(self, pairs: dict[str, ColumnElement[Any]]) -> None:
        super().__init__(_json_value_object(pairs))


class iso_utc(FunctionElement[str]):  # noqa: N801
    """A UTCDateTime column as pydantic writes an aware UTC datetime: `YYYY-MM-DDTHH:MM:SS[.ffffff]Z` (the
    fraction left out when it is zero); NULL stays NULL."""

    type = Text()
    inherit_cache = True


class json_bool(FunctionElement[Any]):  # noqa: N801
    """A Boolean column as a JSON boolean inside `json_object` (SQLite keeps booleans as 0 and 1)."""

    inherit_cache = True


def json_value(column: ColumnElement[Any]) -> ColumnElement[Any]:
    """A column's value inside `json_object`, as pydantic writes it: a UTCDateTime as `iso_utc`, a Boolean as
    `json_bool`, any other as it is."""
    if isinstance(column.type, UTCDateTime):
        return iso_utc(column)
    if isinstance(column.type, Boolean):
        return json_bool(column)
    return column


def _field_name(key: str) -> str:
    if not key.isidentifier():
        raise ValueError(f"not a field name: {key!r}")
    return key


def _arguments(element: FunctionElement[Any], compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.clauses, **kw)


@compiles(json_object, "sqlite")
def _json_object_sqlite(element: json_object, compiler: SQLCompiler, **kw: Any) -> str:
    return f"json_object({_arguments(element, compiler, **kw)})"


@compiles(json_object, "postgresql")
def _json_object_postgresql(element: json_object, compiler: SQLCompiler, **kw: Any) -> str:
    # row_to_json of a one-row subquery, its columns named as the keys: json_build_object looks up each argument's
    # type and output function again on every call, a quarter more of a page's time in the server. As text: the
    # driver would parse a json value into Python objects, the very work this saves.
    items = list(element.clauses)
    keys = [key.name.strip("'") for key in items[::2]]  # json_object's literals: field names, checked when made
    pairs = zip(keys, items[1::2], strict=True)
    columns = ", ".join(f'{compiler.process(value, **kw)} AS "{key}"' for key, value in pairs)
    value = "CAST(row_to_json(fields) AS TEXT)" if element.as_text else "row_to_json(fields)"
    return f"(SELECT {value} FROM (SELECT {columns}) AS fields)"


@compiles(json_array_agg, "sqlite")
def _json_array_agg_sqlite(element: json_array_agg, compiler: SQLCompiler, **kw: Any) -> str:
    return f"json_group_array({_arguments(element, compiler, **kw)})"


@compiles(json_array_agg, "postgresql")
def _json_array_agg_postgresql(element: json_array_agg, compiler: SQLCompiler, **kw: Any) -> str:
    return f"CAST(json_agg({_arguments(element, compiler, **kw)}) AS TEXT)"


@compiles(iso_utc, "sqlite")
def _iso_utc_sqlite(element: iso_utc, compiler: SQLCompiler, **kw: Any) -> str:
    # SQLAlchemy writes SQLite datetimes as `YYYY-MM-DD HH:MM:SS.ffffff`, in UTC (rlctl/service/db/types.py).
    value = _arguments(element, compiler, **kw)
    return f"(replace(replace({value}, ' ', 'T'), '.000000', '') || 'Z')"


@compiles(iso_utc, "postgresql")
def _iso_utc_postgresql(element: iso_utc, compiler: SQLCompiler, **kw: Any) -> str:
    value = f"(({_arguments(element, compiler, **kw)}) AT TIME ZONE 'UTC')"
    # One to_char a value (each costs about as much as the rest of a listed run's object)
    return f"replace(to_char({value}, 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), '.000000Z', 'Z')"


@compiles(json_bool, "sqlite")
def _json_bool_sqlite(element: json_bool, compiler: SQLCompiler, **kw: Any) -> str:
    value = _arguments(element, compiler, **kw)
    return f"json(CASE WHEN {value} IS NULL THEN 'null' WHEN {value} THEN 'true' ELSE 'false' END)"


@compiles(json_bool, "postgresql")
def _json_bool_postgresql(element: json_bool, compiler: SQLCompiler, **kw: Any) -> str:
    return _arguments(element, compiler, **kw)
