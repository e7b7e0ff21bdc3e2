"""Turns input items into trajectory records: format detection, one importer per format, per-item errors.

Typical use, streaming a file of any supported kind::

    with open(path, encoding="utf-8") as lines:
        for outcome in import_items(read_items(lines), fmt="auto"):
            ...  # ImportedRecord(line, record) or ItemError(line, code, message, path)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rlctl.trajectories.convert import UNKNOWN_FORMAT, ConversionError
from rlctl.trajectories.formats.chat import import_openai, import_swe_agent, import_tau_bench
from rlctl.trajectories.formats.openhands import import_openhands
from rlctl.trajectories.formats.responses import import_responses
from rlctl.trajectories.formats.sharegpt import import_batch_runner, import_llamafactory, import_rlctl, import_sharegpt
from rlctl.trajectories.reading import ItemError, RawItem
from rlctl.trajectories.records import TrajectoryRecord

Importer = Callable[[Any], TrajectoryRecord]

FORMATS: dict[str, Importer] = {
    "openai": import_openai,
    "sharegpt": import_sharegpt,
    "responses": import_responses,
    "swe_agent": import_swe_agent,
    "tau_bench": import_tau_bench,
    "llamafactory": import_llamafactory,
    "openhands": import_openhands,
    "rlctl": import_rlctl,
    "batch_runner": import_batch_runner,
}
FORMAT_NAMES: tuple[str, ...] = ("auto", *FORMATS)


@dataclass(frozen=True, slots=True)
class ImportedRecord:
    line: int
    record: TrajectoryRecord


def detect_format(value: Any) -> str | None:
    """The one format whose shape the item has, or None when no format (or more than one) fits."""
    matches = [name for name, fits in _SHAPES if fits(value)]
    return matches[0] if len(matches) == 1 else None


def import_item(item: RawItem, fmt: str = "auto") -> ImportedRecord | ItemError:
    """One parsed item → one record, or the error that stops it, located by the item's line."""
    name = fmt if fmt != "auto" else detect_format(item.value)
    if name is None:
        return ItemError(item.line, UNKNOWN_FORMAT, _undetected_message(item.value))
    importer = FORMATS.get(name)
    if importer is None:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMAT_NAMES)}")
    try:
        return ImportedRecord(item.line, importer(item.value))
    except ConversionError as error:
        return ItemError(item.line, error.code, error.message, error.path)


def import_items(items: Iterable[RawItem | ItemError], fmt: str = "auto") -> Iterator[ImportedRecord | ItemError]:
    """Records (or per-item errors) of read items (`read_items`, an upload's items), one in memory at a time."""
    if fmt not in FORMAT_NAMES:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMAT_NAMES)}")
    for item in items:
        yield item if isinstance(item, ItemError) else import_item(item, fmt)


def _first(value: Any, key: str) -> Any:
    items = value.get(key) if isinstance(value, Mapping) else None
    return items[0] if isinstance(items, list) and items else None


def _is_message_list(value: Any, marker: str) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], Mapping) and marker in value[0]


def _has_typed_value_parts(value: Any) -> bool:
    """LLaMA-Factory v1 parts are {type, value}; OpenAI parts are {type, text}."""
    messages = value.get("messages") if isinstance(value, Mapping) else None
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list) and content:
            return isinstance(content[0], Mapping) and "value" in content[0] and "text" not in content[0]
    return False


def _is_rlctl(value: Any) -> bool:
    return isinstance(value, Mapping) and {"conversations", "source_format", "metadata"} <= value.keys()


def _is_sharegpt(value: Any) -> bool:
    if isinstance(value, Mapping):
        return isinstance(value.get("conversations"), list) and not _is_rlctl(value)
    return _is_message_list(value, "from")


def _is_responses(value: Any) -> bool:
    if not isinstance(value, Mapping):
        return False
    response = value.get("response")
    return "responses_create_params" in value or (
        isinstance(response, Mapping) and isinstance(response.get("output"), list)
    )


def _is_openai(value: Any) -> bool:
    if isinstance(value, Mapping):
        has_messages = isinstance(value.get("messages"), list) or isinstance(value.get("raw_messages"), list)
        return has_messages and not _has_typed_value_parts(value)
    return _is_message_list(value, "role")


def _is_batch_runner(value: Any) -> bool:
    """A ShareGPT ``trajectory`` list (a SWE-agent ``trajectory`` holds steps, not turns)."""
    return isinstance(value, Mapping) and _is_message_list(value.get("trajectory"), "from")


_SHAPES: tuple[tuple[str, Callable[[Any], bool]], ...] = (
    ("rlctl", _is_rlctl),
    ("sharegpt", _is_sharegpt),
    ("responses", _is_responses),
    ("tau_bench", lambda v: isinstance(v, Mapping) and isinstance(v.get("traj"), list)),
    ("swe_agent", lambda v: isinstance(_first(v, "history"), Mapping) and "role" in _first(v, "history")),
    (
        "openhands",
        lambda v: isinstance(_first(v, "history"), Mapping) and {"source", "action"} & _first(v, "history").keys(),
    ),
    ("llamafactory", _has_typed_value_parts),
    ("openai", _is_openai),
    ("batch_runner", _is_batch_runner),
)


def _undetected_message(value: Any) -> str:
    fits = [name for name, shape in _SHAPES if shape(value)]
    if len(fits) > 1:
        return f"the item fits several formats ({', '.join(fits)}); name one explicitly"
    keys = sorted(value)[:8] if isinstance(value, Mapping) else type(value).__name__
    return f"no known trajectory format fits this item (keys: {keys}); name the format explicitly"
