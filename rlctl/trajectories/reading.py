"""Splits an input stream into items (one per future record) without holding more than one item in memory.

Two containers: JSON Lines (one item per line) and one JSON document (an array whose elements are the items,
or a single object). A top-level array whose elements are chat messages is one item (a bare message list).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rlctl.trajectories.convert import EMPTY_RECORD, INVALID_JSON, INVALID_RECORD

Container = Literal["auto", "jsonl", "json"]
TOO_DEEP = "invalid JSON: nested too deeply"
# Deeper values are refused at the door: some readers of a stored record (serialisers with a fixed recursion
# limit) fail on them, which would make a stored dataset unreadable.
MAX_NESTING = 100

# Keys that mark a dict as a whole record (so an array of them is a list of records, not of messages).
_RECORD_KEYS = frozenset({"messages", "conversations", "traj", "history", "responses_create_params", "trajectory"})


class ItemTooLarge(ValueError):
    """One item (a JSON Lines line, an element of a JSON document) over the size limit: nothing is read further."""

    def __init__(self, line: int, limit: int) -> None:
        super().__init__(f"line {line}: an item over the limit of {limit} bytes")
        self.line, self.limit = line, limit


@dataclass(frozen=True, slots=True)
class RawItem:
    line: int  # 1-based line where the item starts in the input
    value: Any


@dataclass(frozen=True, slots=True)
class ItemError:
    line: int
    code: str
    message: str
    path: str | None = None  # where inside the item, e.g. "traj[5].role"


def is_message_like(value: Any) -> bool:
    """A chat message ({role, …}) or ShareGPT turn ({from, value}), not a whole record."""
    if not isinstance(value, Mapping) or _RECORD_KEYS & value.keys():
        return False
    return "role" in value or ("from" in value and "value" in value)


def read_items(lines: Iterable[str], container: Container = "auto") -> Iterator[RawItem | ItemError]:
    """Items of a text stream given line by line (with or without line ends).

    ``auto`` reads JSON Lines when the first non-blank line is a complete JSON value, and one JSON document
    when that line only opens one (e.g. a pretty-printed array); a broken first JSON Lines line stays JSONL.
    """
    stream = _with_line_ends(lines)
    if container == "auto":
        head, stream = _peek_first_content_line(stream)
        container = guess_container(head)
    if container == "jsonl":
        yield from read_jsonl(stream)
    else:
        yield from read_json_document(stream)


def read_jsonl(lines: Iterable[str]) -> Iterator[RawItem | ItemError]:
    for number, line in enumerate(lines, start=1):
        text = line.lstrip("\ufeff").strip() if number == 1 else line.strip()
        if not text:
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            yield ItemError(number, INVALID_JSON, f"invalid JSON: {error.msg} at column {error.colno}")
            continue
        except RecursionError:
            yield ItemError(number, INVALID_JSON, TOO_DEEP)
            continue
        if (problem := unstorable(value)) is not None:
            yield ItemError(number, INVALID_JSON, problem)
            continue
        yield from _items_of_value(value, number)


def unstorable(value: Any) -> str | None:
    """Why a parsed JSON value cannot be stored and read back, or None: nesting deeper than MAX_NESTING, or a
    string (or key) holding a lone surrogate (`"\\ud800"` is valid JSON but no UTF-8 text)."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        current, depth = pending.pop()
        if isinstance(current, str):
            if not current.isascii() and _has_surrogate(current):
                return "invalid JSON: a string holds a lone surrogate (\\ud800-\\udfff), which is not text"
        elif isinstance(current, list | dict):
            if depth > MAX_NESTING:
                return f"{TOO_DEEP} (more than {MAX_NESTING} levels)"
            children = current.items() if isinstance(current, dict) else ((None, item) for item in current)
            for key, child in children:
                if key is not None:
                    pending.append((key, depth))
                pending.append((child, depth + 1))
    return None


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def read_json_document(chunks: Iterable[str], max_item_chars: int | None = None) -> Iterator[RawItem | ItemError]:
    """Items of one JSON document read chunk by chunk: an array's elements, or the document itself. An element
    longer than `max_item_chars` raises ItemTooLarge before it is held whole."""
    splitter = _ArraySplitter(max_item_chars)
    bare_messages: list[Any] | None = None
    for piece in splitter.split(chunks):
        if isinstance(piece, ItemError):
            yield piece
            continue
        if piece.whole_document:
            yield from _items_of_value(piece.value, piece.line)
            continue
        # The first element decides whether the array is a list of records or one bare message list.
        if bare_messages is None and piece.index == 0 and is_message_like(piece.value):
            bare_messages = []
        if bare_messages is not None:
            bare_messages.append(piece.value)
        else:
            yield RawItem(piece.line, piece.value)
    if bare_messages is not None:
        yield RawItem(splitter.document_line, bare_messages)


def _items_of_value(value: Any, line: int) -> Iterator[RawItem | ItemError]:
    if isinstance(value, list) and not (value and is_message_like(value[0])):
        yield from (RawItem(line, element) for element in value)  # an array of records (maybe none)
    elif isinstance(value, dict | list):
        yield RawItem(line, value)
    else:
        yield ItemError(line, INVALID_RECORD, f"expected a JSON object or array, got {type(value).__name__}")


def _with_line_ends(lines: Iterable[str]) -> Iterator[str]:
    for line in lines:
        yield line if line.endswith("\n") else line + "\n"


def _peek_first_content_line(lines: Iterator[str]) -> tuple[str, Iterator[str]]:
    consumed = []
    for line in lines:
        consumed.append(line)
        if line.strip().lstrip("\ufeff"):
            break

    def replay() -> Iterator[str]:
        yield from consumed
        yield from lines

    return (consumed[-1] if consumed else ""), replay()


def guess_container(first_line: str) -> Container:
    text = first_line.strip().lstrip("\ufeff")
    try:
        json.loads(text)
        return "jsonl"
    except RecursionError:
        return "jsonl"  # one whole value, nested too deep: a line whose item is refused as such, never a 500
    except ValueError:
        pass
    opens_document = text in ("[", "{") or text.endswith(("[", "{", ",", ":"))
    return "json" if opens_document else "jsonl"


@dataclass(frozen=True, slots=True)
class _Piece:
    line: int
    value: Any
    index: int = 0
    whole_document: bool = False


_SPECIAL = re.compile(r'[\[\]{}",\\\n]')


class _ArraySplitter:
    """Finds the top-level elements of a JSON array in a stream of text chunks.

    Only brackets, quotes, escapes, commas and newlines are inspected (the regex skips everything else), so a
    multi-megabyte document costs little; each element's text is then parsed with ``json.loads``.
    """

    def __init__(self, max_item_chars: int | None = None) -> None:
        self.max_item_chars = max_item_chars
        self._element_chars = 0
        self.line = 1
        self.document_line = 1
        self._depth = 0
        self._in_string = False
        self._skip_first_char = False  # a backslash ended the previous chunk
        self._kind: str | None = None  # "array", "other", or None before the first character
        self._element: list[str] | None = None  # text pieces of the element being read
        self._element_line = 0
        self._element_start = 0  # offset of the element in the current chunk
        self._index = 0
        self._awaiting_separator = False
        self._after_comma = False
        self._closed = False
        self._errors: list[ItemError] = []

    def split(self, chunks: Iterable[str]) -> Iterator[_Piece | ItemError]:
        for chunk in chunks:
            if self._kind is None and self.line == 1:
                chunk = chunk.lstrip("\ufeff")
            yield from self._feed(chunk)
            if self._errors:
                yield from self._errors
                return
            if self._element is not None:
                self._element.append(chunk[self._element_start :])
                self._element_chars += len(chunk) - self._element_start
                self._element_start = 0
                if self.max_item_chars is not None and self._element_chars > self.max_item_chars:
                    raise ItemTooLarge(self._element_line, self.max_item_chars)
        yield from self._finish()

    def _feed(self, chunk: str) -> Iterator[_Piece | ItemError]:
        if self._closed:
            self._check_plain(chunk, 0, len(chunk))
            return
        position = 0
        skip_at = 0 if self._skip_first_char else -1
        self._skip_first_char = False
        for match in _SPECIAL.finditer(chunk):
            index = match.start()
            char = chunk[index]
            if char == "\n":
                self._check_plain(chunk, position, index)
                self.line += 1
                position = index + 1
                continue
            if index == skip_at:
                continue
            if self._in_string:
                if char == "\\":
                    skip_at = index + 1
                    self._skip_first_char = skip_at == len(chunk)
                elif char == '"':
                    self._in_string = False
                    position = index + 1
                continue
            self._check_plain(chunk, position, index)
            position = index + 1
            yield from self._structural(chunk, index, char)
            if self._closed:
                self._check_plain(chunk, index + 1, len(chunk))
            if self._errors or self._closed:
                return
        self._check_plain(chunk, position, len(chunk))

    def _structural(self, chunk: str, index: int, char: str) -> Iterator[_Piece | ItemError]:
        if char == '"':
            self._open_scalar_element(chunk, index)
            self._in_string = True
        elif char in "[{":
            if self._kind is None:
                self._start_document(char, chunk, index)
            elif self._depth == 1 and self._kind == "array":
                self._open_element(chunk, index)
            self._depth += 1
        elif char in "]}":
            self._depth -= 1
            if self._kind == "array" and self._depth == 1 and self._element is not None:
                yield self._close_element(chunk, index + 1)
            elif self._depth == 0:
                if self._kind == "array" and self._element is not None:
                    yield self._close_element(chunk, index)
                yield from self._close_document(chunk, index + 1)
        elif char == "," and self._kind == "array" and self._depth == 1:
            if self._element is not None:
                yield self._close_element(chunk, index)
            elif not self._awaiting_separator:
                self._fail("unexpected ',' in the array")
            self._awaiting_separator = False
            self._after_comma = True

    def _start_document(self, char: str, chunk: str, index: int) -> None:
        self.document_line = self.line
        self._kind = "array" if char == "[" else "other"
        if self._kind == "other":
            self._element, self._element_start, self._element_line = [], index, self.line
            self._element_chars = 0

    def _check_plain(self, chunk: str, start: int, end: int) -> None:
        """Text between special characters: it may open a scalar element or a scalar/invalid document."""
        if self._in_string or start >= end:
            return
        segment = chunk[start:end]
        stripped = segment.lstrip()
        if not stripped:
            return
        offset = start + len(segment) - len(stripped)
        if self._kind is None:
            self._fail("the document is not a JSON array or object")
        elif self._closed or self._depth == 0:
            self._fail("unexpected data after the end of the document")
        elif self._kind == "array" and self._depth == 1 and self._element is None:
            self._open_element(chunk, offset)

    def _open_scalar_element(self, chunk: str, index: int) -> None:
        if self._kind is None:
            self._fail("the document is not a JSON array or object")
        elif self._kind == "array" and self._depth == 1 and self._element is None:
            self._open_element(chunk, index)

    def _open_element(self, chunk: str, index: int) -> None:
        if self._awaiting_separator:
            self._fail("missing ',' between array elements")
        self._after_comma = False
        self._element, self._element_start, self._element_line = [], index, self.line
        self._element_chars = 0

    def _close_element(self, chunk: str, end: int) -> _Piece | ItemError:
        assert self._element is not None
        text = "".join(self._element) + chunk[self._element_start : end]
        line, index = self._element_line, self._index
        self._element = None
        self._index += 1
        self._awaiting_separator = True
        return self._parse(text, line, index)

    def _close_document(self, chunk: str, end: int) -> Iterator[_Piece | ItemError]:
        self._closed = True
        if self._after_comma:
            self._fail("trailing ',' before the closing bracket")
        if self._kind == "other":
            piece = self._close_element(chunk, end)
            if isinstance(piece, _Piece):
                piece = _Piece(piece.line, piece.value, whole_document=True)
            yield piece

    def _parse(self, text: str, line: int, index: int) -> _Piece | ItemError:
        try:
            value = json.loads(text)
            if (problem := unstorable(value)) is not None:
                return ItemError(line, INVALID_JSON, problem)
            return _Piece(line, value, index)
        except json.JSONDecodeError as error:
            error_line = line + error.lineno - 1
            # Column numbers inside an element are only meaningful on the element's own lines.
            column = f" at column {error.colno}" if error.lineno > 1 else ""
            return ItemError(error_line, INVALID_JSON, f"invalid JSON: {error.msg}{column}")
        except RecursionError:
            return ItemError(line, INVALID_JSON, TOO_DEEP)

    def _fail(self, message: str) -> None:
        self._errors.append(ItemError(self.line, INVALID_JSON, message))

    def _finish(self) -> Iterator[ItemError]:
        if self._kind is None:
            yield ItemError(self.line, EMPTY_RECORD, "the document is empty")
        elif not self._closed:
            line = self._element_line if self._element is not None else self.document_line
            yield ItemError(line, INVALID_JSON, "the document ends before its closing bracket")
