"""The canonical trajectory record: ShareGPT turns plus the structure needed to keep tool ids and names.

A record serialises to one JSON object whose ``conversations`` list is plain ShareGPT (``from``/``value``), so
any ShareGPT reader can train on it. Each turn may also carry structured side fields (``tool_calls`` on gpt
turns, ``tool_call_id``/``name``/``success`` on tool turns) that keep what the tagged text alone would lose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "human", "gpt", "tool"]
ROLES: tuple[Role, ...] = ("system", "human", "gpt", "tool")

RECORD_KEYS = frozenset(
    {
        "conversations",
        "metadata",
        "source_format",
        "declared_tools",
        "completed",
        "reward",
        "reward_breakdown",
        "reward_reasons",
        # Statistics derived from the turns, written beside them for readers; recomputed, never read back.
        "tool_stats",
        "reasoning_stats",
        "api_calls",
    }
)


class RecordFormatError(ValueError):
    """A serialised record does not have the canonical shape."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: Any  # the parsed JSON value, or the original string when it was not JSON


@dataclass(frozen=True, slots=True)
class Turn:
    role: Role
    value: str  # ShareGPT text, with <think>, <tool_call> and <tool_response> tags
    tool_calls: tuple[ToolCall, ...] = ()  # gpt turns: the calls rendered in ``value``
    tool_call_id: str | None = None  # tool turns: the call this result answers
    name: str | None = None  # tool turns: the tool's name
    success: bool | None = None  # tool turns: the outcome, only when the source states one explicitly


@dataclass(frozen=True, slots=True)
class TrajectoryRecord:
    turns: tuple[Turn, ...]
    metadata: dict[str, Any] = field(default_factory=dict)  # the input item's other keys (answer, task_id, ...)
    source_format: str = "sharegpt"
    declared_tools: tuple[str, ...] | None = None  # tool names the source says were available
    completed: bool | None = None  # as stated by the source; None when it says nothing
    reward: float | None = None  # set by scoring
    reward_breakdown: dict[str, float] | None = None
    reward_reasons: dict[str, str] | None = None  # a judge's short reason, by reward name (docs/TRAJECTORIES.md#judge)


def turn_to_dict(turn: Turn) -> dict[str, Any]:
    data: dict[str, Any] = {"from": turn.role, "value": turn.value}
    if turn.tool_calls:
        data["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in turn.tool_calls]
    if turn.tool_call_id is not None:
        data["tool_call_id"] = turn.tool_call_id
    if turn.name is not None:
        data["name"] = turn.name
    if turn.success is not None:
        data["success"] = turn.success
    return data


def record_to_dict(record: TrajectoryRecord) -> dict[str, Any]:
    """The JSON-ready form of a record (one line of a stored dataset)."""
    data: dict[str, Any] = {
        "conversations": [turn_to_dict(t) for t in record.turns],
        "metadata": record.metadata,
        "source_format": record.source_format,
    }
    if record.declared_tools is not None:
        data["declared_tools"] = list(record.declared_tools)
    if record.completed is not None:
        data["completed"] = record.completed
    if record.reward is not None:
        data["reward"] = record.reward
    if record.reward_breakdown is not None:
        data["reward_breakdown"] = record.reward_breakdown
    if record.reward_reasons is not None:
        data["reward_reasons"] = record.reward_reasons
    return data


def turn_from_dict(data: Any, where: str) -> Turn:
    if not isinstance(data, Mapping):
        raise RecordFormatError(f"{where}: a turn must be an object")
    role, value = data.get("from"), data.get("value")
    if role not in ROLES:
        raise RecordFormatError(f"{where}: unknown role {role!r}")
    if not isinstance(value, str):
        raise RecordFormatError(f"{where}: value must be a string")
    calls = tuple(
        _tool_call_from_dict(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(data.get("tool_calls") or ())
    )
    success = data.get("success")
    if success is not None and not isinstance(success, bool):
        raise RecordFormatError(f"{where}: success must be a boolean")
    return Turn(
        role=role,
        value=value,
        tool_calls=calls,
        tool_call_id=_optional_str(data.get("tool_call_id"), f"{where}.tool_call_id"),
        name=_optional_str(data.get("name"), f"{where}.name"),
        success=success,
    )


def record_from_dict(data: Any) -> TrajectoryRecord:
    """Reads the canonical form written by ``record_to_dict``; raises RecordFormatError on any deviation."""
    if not isinstance(data, Mapping):
        raise RecordFormatError("a record must be an object")
    unknown = set(data) - RECORD_KEYS
    if unknown:
        raise RecordFormatError(f"unknown record keys: {sorted(unknown)}")
    conversations = data.get("conversations")
    if not isinstance(conversations, list):
        raise RecordFormatError("conversations must be a list")
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        raise RecordFormatError("metadata must be an object")
    tools = data.get("declared_tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, str) for t in tools)):
        raise RecordFormatError("declared_tools must be a list of strings")
    completed = data.get("completed")
    if completed is not None and not isinstance(completed, bool):
        raise RecordFormatError("completed must be a boolean")
    reward = data.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
        raise RecordFormatError("reward must be a number")
    reasons = data.get("reward_reasons")
    if reasons is not None and not (
        isinstance(reasons, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in reasons.items())
    ):
        raise RecordFormatError("reward_reasons must map reward names to strings")
    return TrajectoryRecord(
        turns=tuple(turn_from_dict(t, f"conversations[{i}]") for i, t in enumerate(conversations)),
        metadata=metadata,
        source_format=str(data.get("source_format", "sharegpt")),
        declared_tools=tuple(tools) if tools is not None else None,
        completed=completed,
        reward=float(reward) if reward is not None else None,
        reward_breakdown=data.get("reward_breakdown"),
        reward_reasons=reasons,
    )


def _tool_call_from_dict(data: Any, where: str) -> ToolCall:
    if not isinstance(data, Mapping) or not isinstance(data.get("id"), str) or not isinstance(data.get("name"), str):
        raise RecordFormatError(f"{where}: a tool call needs string id and name")
    return ToolCall(id=data["id"], name=data["name"], arguments=data.get("arguments"))


def _optional_str(value: Any, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise RecordFormatError(f"{where}: must be a string")
    return value
