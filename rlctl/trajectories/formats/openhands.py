"""OpenHands evaluation output: ``{instance_id, instruction, history: [events], ...}``.

Each agent action carries ``tool_call_metadata.model_response``, the raw chat completion that produced it;
that message (text, reasoning and all its tool calls) becomes one gpt turn, even when the completion made
several calls that OpenHands replays as separate actions. Observations with tool-call metadata become tool
turns; an error observation without it is what OpenHands sends the model as a user message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlctl.trajectories.convert import (
    INVALID_RECORD,
    ConversionError,
    TurnBuilder,
    add_openai_message,
    message_text,
)
from rlctl.trajectories.formats.common import optional_str, other_keys, require_list, require_mapping
from rlctl.trajectories.records import TrajectoryRecord

_SKIPPED_ACTIONS = frozenset({"recall", "change_agent_state", "null"})


def import_openhands(item: Any) -> TrajectoryRecord:
    item = require_mapping(item, "an OpenHands output item")
    history = require_list(item, "history")
    builder = TurnBuilder()
    seen_responses: set[str] = set()
    finished = False
    for index, event in enumerate(history):
        path = f"history[{index}]"
        if not isinstance(event, Mapping):
            raise ConversionError(INVALID_RECORD, "an event must be an object", path)
        if "observation" in event:
            _add_observation(builder, event, path)
        elif "action" in event:
            if not isinstance(event["action"], str):
                raise ConversionError(INVALID_RECORD, "an event's action must be a string", f"{path}.action")
            finished |= event["action"] == "finish"
            _add_action(builder, event, seen_responses, path)
    return TrajectoryRecord(
        turns=builder.build(),
        metadata=other_keys(item, ("history",)),
        source_format="openhands",
        completed=finished and item.get("error") is None,
    )


def _add_action(builder: TurnBuilder, event: Mapping[str, Any], seen: set[str], path: str) -> None:
    action, source = event.get("action"), event.get("source")
    metadata = event.get("tool_call_metadata")
    if action in _SKIPPED_ACTIONS:
        return
    if isinstance(metadata, Mapping):
        _add_tool_action(builder, event, metadata, seen, path)
    elif action == "system":
        builder.add_text("system", _event_text(event, "content"))
    elif source == "user" and action == "message":
        builder.add_text("human", _event_text(event, "content"))
    elif source == "agent" and action in ("message", "finish"):
        builder.add_assistant(_event_text(event, "content" if action == "message" else "final_thought"))


def _add_tool_action(
    builder: TurnBuilder, event: Mapping[str, Any], metadata: Mapping[str, Any], seen: set[str], path: str
) -> None:
    response = metadata.get("model_response")
    response_id = response.get("id") if isinstance(response, Mapping) else None
    if isinstance(response_id, str) and response_id in seen:
        return  # this completion's calls were all added with its first action
    message = _completion_message(response)
    call_id = optional_str(metadata.get("tool_call_id"))
    if message is None or not message.get("tool_calls"):
        # No usable completion: rebuild the call from the action itself.
        raw_args = event.get("args")
        args = raw_args if isinstance(raw_args, Mapping) else {}
        arguments = {k: v for k, v in args.items() if k != "thought"}
        thought = str(args.get("thought") or "")
        name = str(metadata.get("function_name") or event.get("action"))
        builder.add_assistant(thought, None, [(call_id, name, arguments)])
    else:
        add_openai_message(builder, {**message, "role": "assistant"}, f"{path}.tool_call_metadata.model_response")
    if isinstance(response_id, str):
        seen.add(response_id)


def _add_observation(builder: TurnBuilder, event: Mapping[str, Any], path: str) -> None:
    kind = event.get("observation")
    metadata = event.get("tool_call_metadata")
    text = str(event.get("content") if event.get("content") is not None else event.get("message") or "")
    if isinstance(metadata, Mapping):
        success = event.get("success") if isinstance(event.get("success"), bool) else None
        builder.add_tool_result(
            text,
            call_id=optional_str(metadata.get("tool_call_id")),
            name=optional_str(metadata.get("function_name")),
            success=False if kind == "error" else success,
            path=path,
        )
    elif kind == "error":
        builder.add_text("human", text)
    # Other observations without a tool call (recall, agent state changes) are bookkeeping, not conversation.


def _completion_message(response: Any) -> Mapping[str, Any] | None:
    if not isinstance(response, Mapping):
        return None
    choices = response.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, Mapping) else None
    return message if isinstance(message, Mapping) else None


def _event_text(event: Mapping[str, Any], arg: str) -> str:
    args = event.get("args")
    value = args.get(arg) if isinstance(args, Mapping) else None
    if value is None:
        value = event.get("message")
    if isinstance(value, list):
        return message_text(value, arg)[0]
    return str(value or "")
