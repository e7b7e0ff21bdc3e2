"""A tool's JSON schemas, generated from its pydantic models, and its arguments parsed by the same models.

Input schemas are strict function-calling schemas (OpenAI strict mode, MCP): every object closed
(`additionalProperties: false`), every property listed in `required`, and an optional argument nullable, null
meaning "the default". References are inlined and titles and defaults dropped (a default is said in the
description), so a client needs no resolver. The limits (ranges, lengths, patterns, enums) are the models' own.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, TypeAdapter

JsonSchema = dict[str, Any]


def strict_input_schema(model: type[BaseModel], relaxed: bool = False) -> JsonSchema:
    """`relaxed`: the same schema, but `required` lists only the arguments without a default (MCP clients such as
    openai-agents refuse a call that leaves out a listed one, though null would mean its default)."""
    schema = _inline(model.model_json_schema(mode="validation"))
    return _strict(schema, relaxed)


def output_schema(result: Any) -> JsonSchema:
    """The JSON schema of a result model (or a union of them), as an object schema with no references."""
    schema = _inline(TypeAdapter(result).json_schema(mode="serialization"))
    schema = _without_titles(schema)
    if schema.get("type") != "object":
        schema = {"type": "object", **schema}  # MCP wants an object at the top; a union is an anyOf of objects
    return schema


def admits_null(schema: JsonSchema) -> bool:
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(admits_null(option) for option in schema.get("anyOf", ()))


def without_default_nulls(model: type[BaseModel], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments less every null given for an optional field that does not take null (null means the
    default there), in nested models too: strict clients send null for every optional argument."""
    kept: dict[str, Any] = {}
    for name, value in arguments.items():
        field = model.model_fields.get(name)
        if field is None:
            kept[name] = value  # unknown: the model refuses it by name
        elif value is None and not field.is_required() and not _takes_none(field.annotation):
            continue
        else:
            kept[name] = _nested_without_nulls(field.annotation, value)
    return kept


# --- helpers ---


def _strict(schema: JsonSchema, relaxed: bool = False) -> JsonSchema:
    schema = {k: v for k, v in schema.items() if k not in ("title", "default")}
    if "properties" in schema:
        required = set(schema.get("required", ()))
        properties = {}
        for name, original in schema["properties"].items():
            prop = _strict(original, relaxed)
            if name not in required:
                prop = _optional(prop, original.get("default"))
            properties[name] = prop
        listed = [name for name in properties if name in required] if relaxed else list(properties)
        schema.update(properties=properties, required=listed, additionalProperties=False)
    elif schema.get("type") == "object":
        schema["additionalProperties"] = False  # strict mode knows no open objects
    for key in ("items",):
        if isinstance(schema.get(key), dict):
            schema[key] = _strict(schema[key], relaxed)
    for key in ("anyOf", "allOf", "oneOf", "prefixItems"):
        if key in schema:
            schema[key] = [_strict(option, relaxed) for option in schema[key]]
    return schema


def _optional(prop: JsonSchema, default: Any) -> JsonSchema:
    description = prop.get("description", "")
    if default is not None and "default" not in description.lower():
        description = f"{description} Default: {json.dumps(default)}.".strip()
    if not admits_null(prop):
        inner = {k: v for k, v in prop.items() if k != "description"}
        prop = {"anyOf": [inner, {"type": "null"}]}
    return {**prop, "description": description} if description else prop


def _inline(schema: JsonSchema) -> JsonSchema:
    definitions = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                target = definitions[node["$ref"].rsplit("/", 1)[-1]]
                siblings = {k: v for k, v in node.items() if k != "$ref"}
                return resolve({**target, **siblings})
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    resolved: JsonSchema = resolve(schema)
    return resolved


def _without_titles(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: (_without_titles(value) if key != "properties" else _titleless_properties(value))
            for key, value in node.items()
            if key != "title"
        }
    if isinstance(node, list):
        return [_without_titles(item) for item in node]
    return node


def _titleless_properties(properties: dict[str, Any]) -> dict[str, Any]:
    return {name: _without_titles(schema) for name, schema in properties.items()}


def _takes_none(annotation: Any) -> bool:
    return annotation is None or type(None) in typing.get_args(annotation)


def _nested_without_nulls(annotation: Any, value: Any) -> Any:
    model = _model_in(annotation)
    if model is not None and isinstance(value, Mapping):
        return without_default_nulls(model, value)
    item = _list_item(annotation)
    if item is not None and isinstance(value, list):
        return [_nested_without_nulls(item, element) for element in value]
    return value


def _list_item(annotation: Any) -> Any | None:
    """The item type of a list annotation, also inside Optional / a union / Annotated (`list[RewardSpec] | None`:
    an optional list of objects); None for anything else."""
    origin = typing.get_origin(annotation)
    if origin is list:
        return (typing.get_args(annotation) or (Any,))[0]
    if origin is typing.Annotated:
        return _list_item(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return next((item for arg in typing.get_args(annotation) if (item := _list_item(arg)) is not None), None)
    return None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if typing.get_origin(annotation) is typing.Annotated:
        return _model_in(typing.get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return next((m for arg in typing.get_args(annotation) if (m := _model_in(arg)) is not None), None)
    return None
