"""Rendering and parsing of the tags in ShareGPT trajectory text (<think>, <tool_call>, <tool_response>)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from rlctl.trajectories.literals import LiteralError, loads_lenient

# Scratchpad tags some agents write instead of <think>; conversion renames them to <think>.
SCRATCHPAD_TAGS = ("REASONING_SCRATCHPAD", "thinking")

# Untrusted text (uploads, model replies) is scanned with str.find, in one pass: no regular expression, whose
# backtracking over many unclosed tags takes quadratic time (a megabyte of "<tool_call>" froze the service).


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
    for tag in SCRATCHPAD_TAGS:
        text = replace_blocks(text, f"<{tag}>", f"</{tag}>", render_think)
    return text


def has_reasoning(text: str) -> bool:
    """True when the text holds a <think>…</think> block with something in it."""
    return any(text[start:end].strip() for _, start, end, _ in blocks(text, "<think>", "</think>"))


def has_tool_call_tag(text: str) -> bool:
    return "<tool_call>" in text


def visible_text(text: str) -> str:
    """Text outside <think>, <tool_call> and <tool_response> blocks (an unclosed <think> hides the rest)."""
    for tag in ("think", "tool_call", "tool_response"):
        text = replace_blocks(text, f"<{tag}>", f"</{tag}>", lambda _body: "")
    unclosed = text.find("<think>")
    return (text if unclosed < 0 else text[:unclosed]).strip()


def without_tool_calls(text: str) -> str:
    """The text without its <tool_call> blocks, nor the white space before each."""
    pieces, position = [], 0
    for outer_start, _, _, outer_end in blocks(text, "<tool_call>", "</tool_call>"):
        pieces.append(text[position:outer_start].rstrip())
        position = outer_end
    pieces.append(text[position:])
    return "".join(pieces)


def parse_tagged_tool_calls(text: str) -> list[dict[str, Any]]:
    """The JSON objects inside <tool_call> blocks that name a tool; blocks that do not parse are skipped."""
    calls = []
    for _, start, end, _ in blocks(text, "<tool_call>", "</tool_call>"):
        payload = _loads_lenient(text[start:end].strip())
        if isinstance(payload, dict) and isinstance(payload.get("name"), str):
            calls.append(payload)
    return calls


def parse_tagged_tool_response(text: str) -> dict[str, Any] | None:
    """The JSON object inside the first <tool_response> block, when there is one and it parses."""
    for _, start, end, _ in blocks(text, "<tool_response>", "</tool_response>"):
        payload = _loads_lenient(text[start:end].strip())
        return payload if isinstance(payload, dict) else None
    return None


def tool_names_in_tools_block(text: str) -> list[str] | None:
    """Tool names declared in a Hermes-style system prompt's <tools>[…]</tools> block."""
    # Prompts often mention "<tools> </tools>" in prose before the real block.
    for _, start, end, _ in blocks(text, "<tools>", "</tools>", innermost=True):
        payload = _loads_lenient(text[start:end].strip())
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


def blocks(text: str, opening: str, closing: str, innermost: bool = False) -> Iterator[tuple[int, int, int, int]]:
    """(block start, body start, body end, block end) of each `opening`…`closing` block, left to right, not
    overlapping, in linear time: a block's body ends at the first `closing` after its `opening` (as a lazy
    `opening(.*?)closing` would), or, `innermost`, starts at the last `opening` before that `closing`."""
    position = 0
    while (start := text.find(opening, position)) >= 0:
        end = text.find(closing, start + len(opening))
        if end < 0:
            return  # no closing tag after this opening, so none after any later one either
        if innermost:
            start = text.rfind(opening, start, end)
        yield start, start + len(opening), end, end + len(closing)
        position = end + len(closing)


def replace_blocks(text: str, opening: str, closing: str, render: Callable[[str], str]) -> str:
    """The text with each block replaced by `render(body)`."""
    pieces, position = [], 0
    for outer_start, start, end, outer_end in blocks(text, opening, closing):
        pieces += [text[position:outer_start], render(text[start:end])]
        position = outer_end
    if position == 0:
        return text
    pieces.append(text[position:])
    return "".join(pieces)


def _loads_lenient(text: str) -> Any:
    """JSON, or a Python literal (some agents print dicts with single quotes); None when neither parses. The
    Python-literal reading is linear and capped (rlctl/trajectories/literals.py), never ``ast.literal_eval``."""
    try:
        return loads_lenient(text)
    except LiteralError:
        return None
