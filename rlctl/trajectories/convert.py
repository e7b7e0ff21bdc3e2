"""Builds ShareGPT turns from chat messages: the OpenAI → ShareGPT conversion of docs/TRAJECTORIES.md#conversion.

``TurnBuilder`` is the one place where turns are rendered and tool results are paired with their calls; every
importer feeds it. ``convert_openai_messages`` feeds it an OpenAI chat message list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rlctl.trajectories.records import Role, ToolCall, Turn
from rlctl.trajectories.tags import (
    declared_tool_name,
    normalize_scratchpad,
    parse_arguments,
    render_think,
    render_tool_call,
    render_tool_response,
)

# Error codes shared by all importers.
INVALID_JSON = "INVALID_JSON"
INVALID_RECORD = "INVALID_RECORD"
UNKNOWN_FORMAT = "UNKNOWN_FORMAT"
UNKNOWN_ROLE = "UNKNOWN_ROLE"
TOOL_RESULT_WITHOUT_CALL = "TOOL_RESULT_WITHOUT_CALL"
EMPTY_RECORD = "EMPTY_RECORD"

OPENAI_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "human",
    "assistant": "gpt",
    "tool": "tool",
    "function": "tool",  # the legacy name of tool results
}

_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
_REASONING_PART_TYPES = frozenset({"thinking", "reasoning", "reasoning_text"})


def openai_role(value: Any) -> Role | None:
    return OPENAI_ROLES.get(value) if isinstance(value, str) else None


class ConversionError(ValueError):
    """A structural problem in one input item: what went wrong (``code``) and where in the item (``path``)."""

    def __init__(self, code: str, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.path = path


class TurnBuilder:
    """Accumulates turns and pairs each tool result with the earliest unanswered call it names."""

    def __init__(self) -> None:
        self.turns: list[Turn] = []
        self._pending: list[_PendingCall] = []

    def add_text(self, role: Role, text: str) -> None:
        """A system or human turn."""
        self.turns.append(Turn(role=role, value=text))

    def add_assistant(
        self, content: str, reasoning: str | None = None, calls: Iterable[tuple[str | None, str, Any]] = ()
    ) -> None:
        """A gpt turn: <think> reasoning, then the content, then one <tool_call> block per call."""
        tool_calls = self._register_calls(calls)
        parts = []
        if reasoning and reasoning.strip():
            parts.append(render_think(reasoning))
        if content.strip():
            parts.append(normalize_scratchpad(content))
        parts.extend(render_tool_call(call.name, call.arguments) for call in tool_calls)
        self.turns.append(Turn(role="gpt", value="\n".join(parts), tool_calls=tool_calls))

    def add_assistant_verbatim(self, value: str, calls: Iterable[tuple[str | None, str, Any]] = ()) -> None:
        """A gpt turn whose text is already ShareGPT (its calls were parsed out of its tags)."""
        tool_calls = self._register_calls(calls)
        self.turns.append(Turn(role="gpt", value=normalize_scratchpad(value), tool_calls=tool_calls))

    def add_tool_result(
        self,
        content: str,
        call_id: str | None = None,
        name: str | None = None,
        success: bool | None = None,
        path: str | None = None,
        verbatim_value: str | None = None,
    ) -> None:
        """A tool turn answering the call ``call_id`` (or, without an id, the earliest unanswered call)."""
        call = self._take_pending(call_id)
        if call is None:
            described = f"tool result for call {call_id!r}" if call_id else "tool result"
            raise ConversionError(TOOL_RESULT_WITHOUT_CALL, f"{described} has no earlier unanswered tool call", path)
        tool_name = name or call.name
        value = verbatim_value if verbatim_value is not None else render_tool_response(call.id, tool_name, content)
        self.turns.append(Turn(role="tool", value=value, tool_call_id=call.id, name=tool_name, success=success))

    def build(self) -> tuple[Turn, ...]:
        if not self.turns:
            raise ConversionError(EMPTY_RECORD, "the item holds no conversation turns")
        return tuple(self.turns)

    def _register_calls(self, calls: Iterable[tuple[str | None, str, Any]]) -> tuple[ToolCall, ...]:
        registered = []
        for index, (call_id, name, arguments) in enumerate(calls):
            # Formats without call ids pair results by position; a synthetic id keeps the pairing explicit.
            synthetic_id = f"call_{len(self.turns)}_{index}"
            tool_call = ToolCall(id=call_id or synthetic_id, name=name, arguments=arguments)
            registered.append(tool_call)
            self._pending.append(_PendingCall(tool_call, len(self.turns), synthetic_id=call_id is None))
        return tuple(registered)

    def _take_pending(self, call_id: str | None) -> ToolCall | None:
        """The call a result answers: the one with its id; else, for a result without an id or for calls
        written without ids (plain ShareGPT tags), the earliest unanswered call (it takes the result's id)."""
        chosen = next((p for p in self._pending if call_id is not None and p.call.id == call_id), None)
        if chosen is None:
            chosen = next((p for p in self._pending if call_id is None or p.synthetic_id), None)
        if chosen is None:
            return None
        self._pending.remove(chosen)
        if call_id is None or chosen.call.id == call_id:
            return chosen.call
        return self._rename_call(chosen, call_id)

    def _rename_call(self, pending: _PendingCall, call_id: str) -> ToolCall:
        renamed = replace(pending.call, id=call_id)
        turn = self.turns[pending.turn_index]
        calls = tuple(renamed if call is pending.call else call for call in turn.tool_calls)
        self.turns[pending.turn_index] = replace(turn, tool_calls=calls)
        return renamed


@dataclass(eq=False)
class _PendingCall:
    call: ToolCall
    turn_index: int
    synthetic_id: bool


def message_text(content: Any, path: str) -> tuple[str, str]:
    """(text, reasoning) of a message's content: a string, null, or a list of typed parts."""
    if content is None:
        return "", ""
    if isinstance(content, str):
        return content, ""
    if not isinstance(content, list):
        raise ConversionError(INVALID_RECORD, "content must be a string, null or a list of parts", path)
    texts, reasoning = [], []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and part.get("type") in _TEXT_PART_TYPES:
            texts.append(str(part.get("text") or ""))
        elif isinstance(part, Mapping) and part.get("type") in _REASONING_PART_TYPES:
            reasoning.append(str(part.get("thinking") or part.get("text") or ""))
        # Other parts (images, files) carry no text to train on.
    return "".join(texts), "\n".join(r for r in reasoning if r)


def reasoning_field(message: Mapping[str, Any]) -> str:
    """The reasoning a provider returns beside the content (``reasoning_content`` or ``reasoning``)."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            return value
        if isinstance(value, list):
            text, reasoning = message_text(value, key)
            if (text or reasoning).strip():
                return text or reasoning
    return ""


def openai_tool_calls(message: Mapping[str, Any], path: str) -> list[tuple[str | None, str, Any]]:
    """(id, name, arguments) of an assistant message's ``tool_calls`` (or legacy ``function_call``)."""
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise ConversionError(INVALID_RECORD, "tool_calls must be a list", f"{path}.tool_calls")
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):
        raw_calls = [*raw_calls, {"function": legacy}]
    calls = []
    for index, raw in enumerate(raw_calls):
        where = f"{path}.tool_calls[{index}]"
        function = raw.get("function", raw) if isinstance(raw, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(name, str) or not name:
            raise ConversionError(INVALID_RECORD, "a tool call needs a function name", where)
        call_id = raw.get("id") if isinstance(raw.get("id"), str) else None
        calls.append((call_id, name, parse_arguments(function.get("arguments", {}))))
    return calls


def convert_openai_messages(messages: Any, builder: TurnBuilder | None = None, path: str = "messages") -> TurnBuilder:
    """Feeds an OpenAI chat message list to a builder (a new one unless given) and returns the builder."""
    builder = builder or TurnBuilder()
    if not isinstance(messages, list):
        raise ConversionError(INVALID_RECORD, "messages must be a list", path)
    for index, message in enumerate(messages):
        add_openai_message(builder, message, f"{path}[{index}]")
    return builder


def add_openai_message(builder: TurnBuilder, message: Any, path: str) -> None:
    if not isinstance(message, Mapping):
        raise ConversionError(INVALID_RECORD, "a message must be an object", path)
    role = openai_role(message.get("role"))
    if role is None:
        raise ConversionError(UNKNOWN_ROLE, f"unknown role {message.get('role')!r}", f"{path}.role")
    text, part_reasoning = message_text(message.get("content"), f"{path}.content")
    if role == "gpt":
        reasoning = "\n".join(r for r in (reasoning_field(message), part_reasoning) if r)
        builder.add_assistant(text, reasoning, openai_tool_calls(message, path))
    elif role == "tool":
        call_id = message.get("tool_call_id")
        name = message.get("name")
        builder.add_tool_result(
            text,
            call_id=call_id if isinstance(call_id, str) else None,
            name=name if isinstance(name, str) else None,
            path=path,
        )
    else:
        builder.add_text(role, text)


def tool_names(declarations: Any) -> tuple[str, ...] | None:
    """Names from a list of tool declarations (OpenAI chat or Responses style), or None without any."""
    if not isinstance(declarations, Sequence) or isinstance(declarations, str):
        return None
    names = tuple(name for item in declarations if (name := declared_tool_name(item)))
    return names or None  # an empty list usually means the harness did not record its tools
