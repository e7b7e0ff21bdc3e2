"""Tool calls in a model's reply text: the Hermes/Qwen chat templates' ``<tool_call>{json}</tool_call>`` blocks,
split from the reply's content. One rule for every reader of model replies (the inference server's
``message.tool_calls``, collections, multi-turn environments). Pure: no I/O; never raises on any text."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rlctl.trajectories.literals import LiteralError, loads_lenient
from rlctl.trajectories.tags import blocks

OPENING, CLOSING = "<tool_call>", "</tool_call>"


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    name: str
    arguments: dict[str, Any]  # the parsed object (a body's `arguments` given as JSON text is parsed)
    id: str | None = None  # when the body named one

    def arguments_json(self) -> str:
        """The arguments as the JSON text OpenAI's `function.arguments` carries."""
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class ParsedReply:
    content: str  # the reply without its well-formed tool-call blocks (and the white space before each), stripped
    tool_calls: list[ParsedToolCall] = field(default_factory=list)


def split_tool_calls(text: str) -> ParsedReply:
    """The reply's well-formed tool calls, in order, and the text around them. A block whose body is neither JSON
    nor a Python literal (see literals.py), is not an object, names no tool or has arguments that are not an
    object stays in the content as text, as does an unclosed ``<tool_call>`` (a reply cut short)."""
    if OPENING not in text:
        return ParsedReply(content=text.strip())
    pieces: list[str] = []
    calls: list[ParsedToolCall] = []
    position = 0
    for outer_start, start, end, outer_end in blocks(text, OPENING, CLOSING):
        call = parse_call_body(text[start:end])
        if call is None:
            continue  # kept: the text up to the next well-formed block is copied as it is
        pieces.append(text[position:outer_start].rstrip())
        calls.append(call)
        position = outer_end
    pieces.append(text[position:])
    return ParsedReply(content="".join(pieces).strip(), tool_calls=calls)


def parse_call_body(body: str) -> ParsedToolCall | None:
    """One ``{"name": …, "arguments": {…}}`` body (``parameters`` is read as ``arguments``, as some templates
    write it); None when it is not a well-formed call."""
    try:
        payload = loads_lenient(body.strip())
    except LiteralError:
        return None
    if not isinstance(payload, dict):
        return None
    name = payload.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):  # arguments given as JSON text, as OpenAI's wire format carries them
        try:
            arguments = loads_lenient(arguments) if arguments.strip() else {}
        except LiteralError:
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None
    call_id = payload.get("id")
    return ParsedToolCall(name=name.strip(), arguments=arguments, id=call_id if isinstance(call_id, str) else None)
