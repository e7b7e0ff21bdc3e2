"""One agent trajectory: an OpenAI-compatible chat model with tools, turn after turn, until it answers without
calling a tool or `max_turns` model calls are spent.

Tool calls come from the response's `tool_calls`, or, for servers that return raw text, from Hermes-style
`<tool_call>{"name": …, "arguments": …}</tool_call>` blocks in the content. Reasoning comes from
`reasoning_content` / `reasoning` beside the content, or from `<think>` in it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai

from rlctl.sandbox.toolbox import Toolbox
from rlctl.trajectories.tool_calls import split_tool_calls

# Bounds of one item, so a hostile or broken model cannot grow the service's memory or the dataset without end.
MAX_REPLY_CHARS = 400_000  # content and reasoning of one model reply
MAX_CALLS_PER_REPLY = 32
MAX_TOOL_CALLS = 256  # tool calls of one item
MAX_TOOL_OUTPUT_CHARS = 4_000_000  # tool results of one item, together
MAX_RESPONSE_BYTES = 8 << 20  # one HTTP answer of the model endpoint, read no further (a reply at its cap is less)


class BadResponse(Exception):
    """The endpoint answered something that is not a usable chat completion."""


class Interrupted(Exception):
    """The job was cancelled or the service is stopping: the item is left to a resume, not recorded."""


@dataclass
class AgentSettings:
    model: str
    max_turns: int
    max_tokens: int
    temperature: float


@dataclass
class Trajectory:
    messages: list[dict[str, Any]]  # the conversation, with reasoning kept beside the content
    completed: bool = False
    api_calls: int = 0
    tool_calls: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    tool_output_chars: int = 0


class LimitExceeded(BadResponse):
    """The model went past a bound of one item (reply size, tool calls, tool output): the item fails."""


def _check_limits(trajectory: Trajectory, assistant: dict[str, Any], calls: list[Any]) -> None:
    size = len(assistant.get("content") or "") + len(assistant.get("reasoning_content") or "")
    if size > MAX_REPLY_CHARS:
        raise LimitExceeded(f"a model reply of {size} characters, over the limit of {MAX_REPLY_CHARS}")
    if len(calls) > MAX_CALLS_PER_REPLY:
        raise LimitExceeded(f"a model reply with {len(calls)} tool calls, over the limit of {MAX_CALLS_PER_REPLY}")
    if trajectory.tool_calls + len(calls) > MAX_TOOL_CALLS:
        raise LimitExceeded(f"more than {MAX_TOOL_CALLS} tool calls in one item")


def run_agent(
    client: openai.OpenAI,
    settings: AgentSettings,
    messages: list[dict[str, Any]],
    toolbox: Toolbox,
    should_stop: Callable[[], bool],
) -> Trajectory:
    trajectory = Trajectory(messages=list(messages))
    wire = list(messages)  # what the endpoint gets back: no reasoning fields (not every server accepts them)
    schemas = toolbox.schemas()
    for turn in range(settings.max_turns):
        if should_stop():
            raise Interrupted()
        # Messages and tool schemas are plain JSON here; the SDK's TypedDicts describe the same shapes.
        response = client.chat.completions.create(  # type: ignore[call-overload]
            model=settings.model,
            messages=wire,
            max_tokens=settings.max_tokens,
            temperature=settings.temperature,
            **({"tools": schemas} if schemas else {}),
        )
        trajectory.api_calls += 1
        if not response.choices:
            raise BadResponse("the endpoint answered no choices")
        choice = response.choices[0]
        trajectory.finish_reasons.append(str(choice.finish_reason))
        assistant, calls = _assistant_message(choice.message, turn)
        _check_limits(trajectory, assistant, calls)
        trajectory.messages.append(assistant)
        wire.append({key: value for key, value in assistant.items() if key != "reasoning_content"})
        if not calls:
            trajectory.completed = choice.finish_reason != "length"  # an answer cut short is not a final one
            return trajectory
        for call_id, name, arguments in calls:
            if should_stop():
                raise Interrupted()
            result = toolbox.call(name, arguments)
            trajectory.tool_calls += 1
            trajectory.tool_output_chars += len(result)
            if trajectory.tool_output_chars > MAX_TOOL_OUTPUT_CHARS:
                raise LimitExceeded(f"tool output of the item over {MAX_TOOL_OUTPUT_CHARS} characters")
            tool_message = {"role": "tool", "tool_call_id": call_id, "name": name, "content": result}
            trajectory.messages.append(tool_message)
            wire.append(tool_message)
    return trajectory


def _assistant_message(message: Any, turn: int) -> tuple[dict[str, Any], list[tuple[str, str, Any]]]:
    content = message.content or ""
    if len(content) > MAX_REPLY_CHARS:  # before any parsing of it
        raise LimitExceeded(f"a model reply of {len(content)} characters, over the limit of {MAX_REPLY_CHARS}")
    extra = message.model_extra or {}
    reasoning = extra.get("reasoning_content") or extra.get("reasoning")
    listed = message.tool_calls or []
    if len(listed) > MAX_CALLS_PER_REPLY:
        raise LimitExceeded(f"a model reply with {len(listed)} tool calls, over the limit of {MAX_CALLS_PER_REPLY}")
    calls = [
        (call.id or f"call_{turn}_{index}", call.function.name, _parsed(call.function.arguments))
        for index, call in enumerate(listed)
        if getattr(call, "function", None) is not None
    ]
    if not calls and "<tool_call>" in content:
        parsed = split_tool_calls(content)  # malformed blocks stay in the content as text
        if len(parsed.tool_calls) > MAX_CALLS_PER_REPLY:
            raise LimitExceeded(
                f"a model reply with {len(parsed.tool_calls)} tool calls, over the limit of {MAX_CALLS_PER_REPLY}"
            )
        calls = [(call.id or f"call_{turn}_{i}", call.name, call.arguments) for i, call in enumerate(parsed.tool_calls)]
        if calls:
            content = parsed.content
    assistant: dict[str, Any] = {"role": "assistant", "content": content}
    if isinstance(reasoning, str) and reasoning.strip():
        assistant["reasoning_content"] = reasoning
    if calls:
        assistant["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
            }
            for call_id, name, arguments in calls
        ]
    return assistant, calls


def _parsed(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments
    return arguments
