"""Formats whose conversation is an OpenAI chat message list: plain OpenAI chat (also LLM-call logs with a
``response``), tau-bench results and SWE-agent ``.traj`` files."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlctl.trajectories.convert import (
    INVALID_RECORD,
    ConversionError,
    add_openai_message,
    convert_openai_messages,
    tool_names,
)
from rlctl.trajectories.formats.common import optional_bool, other_keys, require_list, require_mapping
from rlctl.trajectories.records import TrajectoryRecord

TAU_STOP_TOKEN = "###STOP###"
TAU_TRANSFER_TOOL = "transfer_to_human_agents"


def import_openai(item: Any) -> TrajectoryRecord:
    """``{"messages": [...]}`` (other keys become metadata), or a bare message list.

    An LLM-call log (``messages`` plus a ``response`` chat completion) gets the response's message as its last
    turn; when it also has ``raw_messages`` (the tool-calling form of the same prompt), those are used.
    """
    if isinstance(item, list):
        builder = convert_openai_messages(item, path="$")
        return TrajectoryRecord(turns=builder.build(), source_format="openai")
    item = require_mapping(item, "an OpenAI chat item")
    key = "raw_messages" if isinstance(item.get("raw_messages"), list) else "messages"
    builder = convert_openai_messages(require_list(item, key), path=key)
    response_message = _logged_response_message(item)
    if response_message is not None:
        add_openai_message(builder, response_message, "response.choices[0].message")
    return TrajectoryRecord(
        turns=builder.build(),
        metadata=other_keys(item, ("messages", "raw_messages", "completed")),
        source_format="openai",
        declared_tools=tool_names(item.get("tools")),
        completed=optional_bool(item.get("completed")),
    )


def import_tau_bench(item: Any) -> TrajectoryRecord:
    """One tau-bench result: ``{task_id, reward, info, traj, trial}`` with ``traj`` an OpenAI message list."""
    item = require_mapping(item, "a tau-bench result")
    messages = require_list(item, "traj")
    builder = convert_openai_messages(messages, path="traj")
    return TrajectoryRecord(
        turns=builder.build(),
        metadata=other_keys(item, ("traj",)),
        source_format="tau_bench",
        completed=_tau_episode_ended(messages),
    )


def import_swe_agent(item: Any) -> TrajectoryRecord:
    """A SWE-agent ``.traj``: ``history`` is OpenAI-like; tool results name ``tool_call_ids`` (a list).

    ``trajectory`` (the per-step replay of the same run, often most of the file) is left out of the metadata.
    """
    item = require_mapping(item, "a SWE-agent trajectory")
    history = require_list(item, "history")
    builder = convert_openai_messages([_swe_agent_message(m) for m in history], path="history")
    info = item.get("info")
    exit_status = info.get("exit_status") if isinstance(info, Mapping) else None
    return TrajectoryRecord(
        turns=builder.build(),
        metadata=other_keys(item, ("history", "trajectory")),
        source_format="swe_agent",
        completed=None if exit_status is None else str(exit_status).startswith("submitted"),
    )


def _swe_agent_message(message: Any) -> Any:
    if not isinstance(message, Mapping) or "tool_call_id" in message:
        return message
    ids = message.get("tool_call_ids")
    if isinstance(ids, list) and ids and isinstance(ids[0], str):
        return {**message, "tool_call_id": ids[0]}
    return message


def _logged_response_message(item: Mapping[str, Any]) -> Mapping[str, Any] | None:
    response = item.get("response")
    if not isinstance(response, Mapping):
        return None
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        return None
    first = choices[0]
    message = first.get("message") if isinstance(first, Mapping) else None
    if message is not None and not isinstance(message, Mapping):
        raise ConversionError(INVALID_RECORD, "response message must be an object", "response.choices[0]")
    return message


def _tau_episode_ended(messages: list[Any]) -> bool:
    """The simulated user said the stop token, or the agent handed over to a human: the episode ended."""
    last = messages[-1] if messages else None
    if isinstance(last, Mapping) and last.get("role") == "user" and TAU_STOP_TOKEN in str(last.get("content")):
        return True
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, Mapping) else None
        for call in calls if isinstance(calls, list) else []:
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping) and function.get("name") == TAU_TRANSFER_TOOL:
                return True
    return False
