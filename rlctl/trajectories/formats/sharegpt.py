"""ShareGPT-style formats: plain ShareGPT (also Hermes-agent output and LLaMA-Factory's ``function_call`` /
``observation`` roles), LLaMA-Factory's "v1" typed-part messages, and rlctl's own stored records."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from rlctl.trajectories.convert import (
    INVALID_RECORD,
    UNKNOWN_ROLE,
    ConversionError,
    TurnBuilder,
    openai_role,
    tool_names,
)
from rlctl.trajectories.formats.common import (
    optional_bool,
    optional_str,
    other_keys,
    require_list,
    require_mapping,
)
from rlctl.trajectories.records import RecordFormatError, Role, TrajectoryRecord, record_from_dict
from rlctl.trajectories.tags import (
    parse_arguments,
    parse_tagged_tool_calls,
    parse_tagged_tool_response,
    tool_names_in_tools_block,
)

SHAREGPT_ROLES: dict[str, Role | Literal["function_call"]] = {
    "system": "system",
    "human": "human",
    "user": "human",
    "gpt": "gpt",
    "assistant": "gpt",
    "tool": "tool",
    "observation": "tool",  # LLaMA-Factory
    "function_call": "function_call",  # LLaMA-Factory: the turn holds the call's JSON, not tagged text
}

Call = tuple[str | None, str, Any]


def import_sharegpt(item: Any) -> TrajectoryRecord:
    """``{"conversations": [{from, value}, ...]}`` (other keys become metadata), or a bare list of turns."""
    if isinstance(item, list):
        item = {"conversations": item}
    item = require_mapping(item, "a ShareGPT item")
    builder = TurnBuilder()
    for index, turn in enumerate(require_list(item, "conversations")):
        _add_sharegpt_turn(builder, turn, f"conversations[{index}]")
    turns = builder.build()
    return TrajectoryRecord(
        turns=turns,
        metadata=other_keys(item, ("conversations", "completed")),
        source_format="sharegpt",
        declared_tools=_declared_tools(item.get("tools"), turns[0].value if turns[0].role == "system" else ""),
        completed=optional_bool(item.get("completed")),
    )


# Statistics a batch runner wrote beside its trajectory; rlctl recomputes them from the turns, so they are not kept.
BATCH_RUNNER_STATS = ("tool_stats", "reasoning_stats", "api_calls")


def import_batch_runner(item: Any) -> TrajectoryRecord:
    """A batch runner's record: ``{"trajectory": [{from, value}, ...], "completed", "tool_stats", ...}``.

    The trajectory is ShareGPT turns (an OpenAI message list is refused with a clear error); ``completed`` is
    kept, the runner's own statistics are dropped, and its other keys (``toolsets_used``, ...) become metadata.
    """
    item = require_mapping(item, "a batch runner record")
    turns = require_list(item, "trajectory")
    if turns and isinstance(turns[0], Mapping) and "from" not in turns[0]:
        raise ConversionError(INVALID_RECORD, "trajectory turns must be ShareGPT {from, value}", "trajectory[0]")
    builder = TurnBuilder()
    for index, turn in enumerate(turns):
        _add_sharegpt_turn(builder, turn, f"trajectory[{index}]")
    built = builder.build()
    return TrajectoryRecord(
        turns=built,
        metadata=other_keys(item, ("trajectory", "completed", *BATCH_RUNNER_STATS)),
        source_format="batch_runner",
        declared_tools=_declared_tools(item.get("tools"), built[0].value if built[0].role == "system" else ""),
        completed=optional_bool(item.get("completed")),
    )


def import_llamafactory(item: Any) -> TrajectoryRecord:
    """LLaMA-Factory "v1": ``{"messages": [{role, content: [{type, value}]}]}``.

    Part types: text, reasoning, tool_call, tool_calls.

    Calls carry no ids, so results pair with calls by position.
    """
    item = require_mapping(item, "a LLaMA-Factory item")
    builder = TurnBuilder()
    for index, message in enumerate(require_list(item, "messages")):
        _add_llamafactory_message(builder, message, f"messages[{index}]")
    return TrajectoryRecord(
        turns=builder.build(),
        metadata=other_keys(item, ("messages",)),
        source_format="llamafactory",
        declared_tools=_declared_tools(item.get("tools"), ""),
    )


def import_rlctl(item: Any) -> TrajectoryRecord:
    """A record as rlctl stores it (``record_to_dict``)."""
    try:
        record = record_from_dict(item)
    except RecordFormatError as error:
        raise ConversionError(INVALID_RECORD, str(error)) from error
    if not record.turns:
        raise ConversionError(INVALID_RECORD, "the record holds no conversation turns", "conversations")
    return record


def _add_sharegpt_turn(builder: TurnBuilder, turn: Any, path: str) -> None:
    if not isinstance(turn, Mapping) or not isinstance(turn.get("value"), str):
        raise ConversionError(INVALID_RECORD, "a turn must be an object with a string 'value'", path)
    role = SHAREGPT_ROLES.get(turn["from"]) if isinstance(turn.get("from"), str) else None
    text = turn["value"]
    if role is None:
        raise ConversionError(UNKNOWN_ROLE, f"unknown role {turn.get('from')!r}", f"{path}.from")
    if role == "gpt":
        builder.add_assistant_verbatim(text, _structured_calls(turn) or _tagged_calls(text))
    elif role == "function_call":
        builder.add_assistant("", None, _json_calls(text, path))
    elif role == "tool":
        _add_sharegpt_tool_result(builder, turn, text, path)
    else:
        builder.add_text(role, text)


def _add_sharegpt_tool_result(builder: TurnBuilder, turn: Mapping[str, Any], text: str, path: str) -> None:
    tagged = parse_tagged_tool_response(text)
    if tagged is None and "<tool_response>" not in text:
        builder.add_tool_result(text, optional_str(turn.get("tool_call_id")), optional_str(turn.get("name")), path=path)
        return
    tagged = tagged or {}
    builder.add_tool_result(
        str(tagged.get("content", "")),
        call_id=optional_str(turn.get("tool_call_id")) or optional_str(tagged.get("tool_call_id")),
        name=optional_str(turn.get("name")) or optional_str(tagged.get("name")),
        success=optional_bool(turn.get("success")),
        path=path,
        verbatim_value=text,
    )


def _structured_calls(turn: Mapping[str, Any]) -> list[Call]:
    """Calls kept beside the text by rlctl's own records."""
    raw = turn.get("tool_calls")
    if not isinstance(raw, list):
        return []
    return [
        (optional_str(call.get("id")), call["name"], call.get("arguments"))
        for call in raw
        if isinstance(call, Mapping) and isinstance(call.get("name"), str)
    ]


def _tagged_calls(text: str) -> list[Call]:
    return [
        (optional_str(call.get("id")), call["name"], parse_arguments(call.get("arguments", {})))
        for call in parse_tagged_tool_calls(text)
    ]


def _json_calls(text: str, path: str) -> list[Call]:
    """A LLaMA-Factory ``function_call`` turn: one ``{"name", "arguments"}`` object or a list of them."""
    try:
        payload = json.loads(text)
    except ValueError as error:
        raise ConversionError(INVALID_RECORD, f"function_call value is not JSON: {error}", path) from error
    calls = payload if isinstance(payload, list) else [payload]
    if not calls or not all(isinstance(c, Mapping) and isinstance(c.get("name"), str) for c in calls):
        raise ConversionError(INVALID_RECORD, "function_call value needs a tool 'name'", path)
    return [(optional_str(c.get("id")), c["name"], parse_arguments(c.get("arguments", {}))) for c in calls]


def _add_llamafactory_message(builder: TurnBuilder, message: Any, path: str) -> None:
    if not isinstance(message, Mapping):
        raise ConversionError(INVALID_RECORD, "a message must be an object", path)
    role = openai_role(message.get("role"))
    if role is None:
        raise ConversionError(UNKNOWN_ROLE, f"unknown role {message.get('role')!r}", f"{path}.role")
    texts, reasoning, calls = _llamafactory_parts(message.get("content"), f"{path}.content")
    if role == "gpt":
        builder.add_assistant("".join(texts), "\n".join(reasoning), calls)
    elif role == "tool":
        builder.add_tool_result("".join(texts), path=path)
    else:
        builder.add_text(role, "".join(texts))


def _llamafactory_parts(content: Any, path: str) -> tuple[list[str], list[str], list[Call]]:
    if isinstance(content, str):
        return [content], [], []
    if not isinstance(content, list):
        raise ConversionError(INVALID_RECORD, "content must be a string or a list of parts", path)
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[Call] = []
    for index, part in enumerate(content):
        where = f"{path}[{index}]"
        if not isinstance(part, Mapping):
            raise ConversionError(INVALID_RECORD, "a content part must be an object", where)
        kind, value = part.get("type"), part.get("value")
        if kind == "text":
            texts.append(str(value or ""))
        elif kind == "reasoning":
            reasoning.append(str(value or ""))
        elif kind in ("tool_call", "tool_calls"):
            calls.extend(_json_calls(value if isinstance(value, str) else json.dumps(value), where))
    return texts, reasoning, calls


def _declared_tools(tools: Any, system_prompt: str) -> tuple[str, ...] | None:
    """Tool names from a ``tools`` field (a list or its JSON text), else the system prompt's <tools> block."""
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError:
            tools = None
    names = tool_names(tools)
    if names is not None:
        return names
    from_prompt = tool_names_in_tools_block(system_prompt)
    return tuple(from_prompt) if from_prompt is not None else None
