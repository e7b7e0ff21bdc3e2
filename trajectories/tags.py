"""Rendering and parsing of the tags in ShareGPT trajectory text (<think>, <tool_call>, <tool_response>)."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

# Scratchpad tags some agents write instead of <think>; conversion renames them to <think>.
SCRATCHPAD_TAGS = ("REASONING_SCRATCHPAD", "thinking")

_THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_UNCLOSED_THINK = re.compile(r"<think>.*\Z", re.DOTALL)
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_TOOL_RESPONSE_BLOCK = re.compile(r"<tool_response>(.*?)</tool_response>", re.DOTALL)
_SCRATCHPAD_BLOCKS = [re.compile(rf"<{tag}>(.*?)</{tag}>", re.DOTALL) for tag in SCRATCHPAD_TAGS]
_TOOLS_BLOCK = re.compile(r"<tools>((?:(?!<tools>).)*?)</tools>", re.DOTALL)


def render_think(reasoning: str) -> str:
    return f"<think>\n{reasoning.strip()}\n</think>"


def render_tool_call(name: str, arguments: Any) -> str:
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def render_tool_response(tool_call_id: str, name: str, content: str) -> str:
    payload = json.dumps({"tool_call_id": tool_call_id, "name": name, "content": content}, ensure_ascii=False)
    return f"<tool_response>\n{payload}\n</tool_response>"


def parse_arguments(arguments: Any) -> Any:
    """Tool-call arguments as a JSON value; a string that is not JSON is kept as it is."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def normalize_scratchpad(text: str) -> str:
    """Renames scratchpad tags (e.g. <REASONING_SCRATCHPAD>) to <think>."""
    for pattern in _SCRATCHPAD_BLOCKS:
        text = pattern.sub(lambda m: render_think(m.group(1)), text)
    return text


def has_reasoning(text: str) -> bool:
    """True when the text holds a <think>…</think> block with something in it."""
    return any(block.strip() for block in _THINK_BLOCK.findall(text))


def has_tool_call_tag(text: str) -> bool:
    return "<tool_call>" in text


def visible_text(text: str) -> str:
    """Text outside <think>, <tool_call> and <tool_response> blocks (an unclosed <think> hides the rest)."""
    for pattern in (_THINK_BLOCK, _TOOL_CALL_BLOCK, _TOOL_RESPONSE_BLOCK):
        text = pattern.sub("", text)
    return _UNCLOSED_THINK.sub("", text).strip()


def parse_tagged_tool_calls(text: str) -> list[dict[str, Any]]:
    """The JSON objects inside <tool_call> blocks that name a tool; blocks that do not parse are skipped."""
    calls = []
    for body in _TOOL_CALL_BLOCK.findall(text):
        payload = _loads_lenient(body.strip())
        if isinstance(payload, dict) and isinstance(payload.get("name"), str):
            calls.append(payload)
    return calls


def parse_tagged_tool_response(text: str) -> dict[str, Any] | None:
    """The JSON object inside the first <tool_response> block, when there is one and it parses."""
    match = _TOOL_RESPONSE_BLOCK.search(text)
    if match is None:
        return None
    payload = _loads_lenient(match.group(1).strip())
    return payload if isinstance(payload, dict) else None


def tool_names_in_tools_block(text: str) -> list[str] | None:
    """Tool names declared in a Hermes-style system prompt's <tools>[…]</tools> block."""
    # Prompts often mention "<tools> </tools>" in prose before the real block.
    for match in _TOOLS_BLOCK.finditer(text):
        payload = _loads_lenient(match.group(1).strip())
        if isinstance(payload, dict):
            payload = [payload]
        if isinstance(payload, list) and payload:
            return [name for item in payload if (name := declared_tool_name(item))]
    return None


def declared_tool_name(item: Any) -> str | None:
    """The name in a tool declaration: {"name": …} or {"type": "function", "function": {"name": …}}."""
    if not isinstance(item, dict):
        return None
    function = item.get("function")
    name = function.get("name") if isinstance(function, dict) else item.get("name")
    return name if isinstance(name, str) else None


def _loads_lenient(text: str) -> Any:
    """JSON, or a Python literal (some agents print dicts with single quotes); None when neither parses."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
