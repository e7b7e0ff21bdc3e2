"""OpenAI Responses API rollouts (e.g. NeMo Gym): ``responses_create_params.input`` then ``response.output``,
items of type message / reasoning / function_call / function_call_output.

Consecutive reasoning, assistant message and function_call items form one gpt turn; a function_call_output
or a user message ends it. Reasoning that arrives between a call and its output still belongs to that turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rlctl.trajectories.convert import (
    INVALID_RECORD,
    UNKNOWN_ROLE,
    ConversionError,
    TurnBuilder,
    message_text,
    openai_role,
    tool_names,
)
from rlctl.trajectories.formats.common import optional_str, other_keys, require_mapping
from rlctl.trajectories.records import TrajectoryRecord
from rlctl.trajectories.tags import parse_arguments


@dataclass
class _AssistantDraft:
    texts: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[tuple[str | None, str, Any]] = field(default_factory=list)

    def flush(self, builder: TurnBuilder) -> None:
        if self.texts or self.reasoning or self.calls:
            builder.add_assistant(
                "\n".join(t for t in self.texts if t.strip()), "\n\n".join(self.reasoning), self.calls
            )
        self.texts, self.reasoning, self.calls = [], [], []


def import_responses(item: Any) -> TrajectoryRecord:
    item = require_mapping(item, "a Responses API rollout")
    params = item.get("responses_create_params") or {}
    response = item.get("response") or {}
    if not isinstance(params, Mapping) or not isinstance(response, Mapping):
        raise ConversionError(INVALID_RECORD, "responses_create_params and response must be objects")
    builder, draft = TurnBuilder(), _AssistantDraft()
    instructions = params.get("instructions") or response.get("instructions")
    if isinstance(instructions, str) and instructions.strip():
        builder.add_text("system", instructions)
    _add_items(builder, draft, params.get("input"), "responses_create_params.input")
    _add_items(builder, draft, response.get("output"), "response.output")
    draft.flush(builder)
    return TrajectoryRecord(
        turns=builder.build(),
        metadata=_metadata(item, params, response),
        source_format="responses",
        declared_tools=tool_names(params.get("tools") or response.get("tools")),
        completed=_completed(response),
    )


def _add_items(builder: TurnBuilder, draft: _AssistantDraft, items: Any, path: str) -> None:
    if items is None:
        return
    if isinstance(items, str):
        builder.add_text("human", items)
        return
    if not isinstance(items, list):
        raise ConversionError(INVALID_RECORD, "input/output must be a string or a list of items", path)
    for index, entry in enumerate(items):
        _add_item(builder, draft, entry, f"{path}[{index}]")


def _add_item(builder: TurnBuilder, draft: _AssistantDraft, entry: Any, path: str) -> None:
    if not isinstance(entry, Mapping):
        raise ConversionError(INVALID_RECORD, "an item must be an object", path)
    kind = entry.get("type") or ("message" if "role" in entry else None)
    if kind == "message":
        _add_message(builder, draft, entry, path)
    elif kind == "reasoning":
        draft.reasoning.extend(_reasoning_texts(entry))
    elif kind == "function_call":
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ConversionError(INVALID_RECORD, "a function_call needs a name", path)
        call_id = optional_str(entry.get("call_id")) or optional_str(entry.get("id"))
        draft.calls.append((call_id, name, parse_arguments(entry.get("arguments", {}))))
    elif kind == "function_call_output":
        draft.flush(builder)
        output = entry.get("output")
        text = output if isinstance(output, str) else message_text(output, f"{path}.output")[0]
        builder.add_tool_result(text, call_id=optional_str(entry.get("call_id")), path=path)
    else:
        raise ConversionError(INVALID_RECORD, f"unsupported item type {kind!r}", f"{path}.type")


def _add_message(builder: TurnBuilder, draft: _AssistantDraft, entry: Mapping[str, Any], path: str) -> None:
    role = openai_role(entry.get("role"))
    if role is None or role == "tool":
        raise ConversionError(UNKNOWN_ROLE, f"unknown message role {entry.get('role')!r}", f"{path}.role")
    text, reasoning = message_text(entry.get("content"), f"{path}.content")
    if role == "gpt":
        if draft.calls:  # text after calls starts the next model turn
            draft.flush(builder)
        draft.texts.append(text)
        if reasoning:
            draft.reasoning.append(reasoning)
        return
    draft.flush(builder)
    builder.add_text(role, text)


def _reasoning_texts(entry: Mapping[str, Any]) -> list[str]:
    texts = []
    for key in ("summary", "content"):
        parts = entry.get(key)
        for part in parts if isinstance(parts, list) else []:
            text = part.get("text") if isinstance(part, Mapping) else None
            if isinstance(text, str) and text.strip():
                texts.append(text.strip())
    return texts  # encrypted-only reasoning has no text to keep


def _metadata(item: Mapping[str, Any], params: Mapping[str, Any], response: Mapping[str, Any]) -> dict[str, Any]:
    metadata = other_keys(item, ("responses_create_params", "response"))
    if params:
        metadata["responses_create_params"] = other_keys(params, ("input",))
    if response:
        metadata["response"] = other_keys(response, ("output",))
    return metadata


def _completed(response: Mapping[str, Any]) -> bool | None:
    if response.get("incomplete_details") or response.get("error"):
        return False
    status = response.get("status")
    return status == "completed" if isinstance(status, str) else None
