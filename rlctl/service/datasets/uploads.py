"""Items of an uploaded byte stream: UTF-8 checked, JSON Lines read line by line, one JSON document read in
chunks (so a minified single-line document of any size never sits in memory whole)."""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator
from typing import Protocol, runtime_checkable

from rlctl.trajectories.reading import (
    Container,
    ItemError,
    ItemTooLarge,
    RawItem,
    guess_container,
    read_items,
    read_json_document,
)

CHUNK_BYTES = 1 << 20
# The first line decides the container; a longer first line is taken for a minified JSON document.
PEEK_LIMIT_BYTES = 64 << 20
# One item (a JSON Lines line, an element of a JSON document) at most: parsing holds an item whole, several
# times its size, so this bounds the service's memory whatever the upload (the upload's total is bounded apart).
MAX_ITEM_BYTES = 16 << 20


class UndecodableUpload(ValueError):
    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: the upload is not UTF-8 text ({reason})")
        self.line = line


@runtime_checkable
class ByteStream(Protocol):
    """A seekable binary upload: a spooled file, or the routes' wrapper of one."""

    def read(self, size: int = -1, /) -> bytes: ...

    def readline(self, size: int = -1, /) -> bytes: ...

    def tell(self) -> int: ...

    def seek(self, offset: int, whence: int = 0, /) -> int: ...

    def __iter__(self) -> Iterator[bytes]: ...


def upload_items(source: ByteStream | Iterable[str], container: Container = "auto") -> Iterator[RawItem | ItemError]:
    """Items of a seekable binary stream (an uploaded file) or of text lines (agent tools, tests)."""
    if not isinstance(source, ByteStream):
        yield from read_items(source, container)
        return
    stream = source
    if container == "auto":
        container = _detect_container(stream)
    if container == "jsonl":
        yield from read_items(_decoded_lines(stream), "jsonl")
    else:
        yield from read_json_document(_decoded_chunks(stream), max_item_chars=MAX_ITEM_BYTES)


def _detect_container(stream: ByteStream) -> Container:
    start = stream.tell()
    try:
        while True:
            line = stream.readline(PEEK_LIMIT_BYTES)
            if not line:
                return "jsonl"  # empty: either reader reports it
            if not line.endswith(b"\n") and len(line) >= PEEK_LIMIT_BYTES:
                return "json"
            text = line.decode("utf-8", errors="replace").strip().lstrip("\ufeff")
            if text:
                return guess_container(text)
    finally:
        stream.seek(start)


def _decoded_lines(stream: ByteStream) -> Iterator[str]:
    number = 0
    while raw := stream.readline(MAX_ITEM_BYTES + 1):  # never more than one item's worth in memory
        number += 1
        if len(raw) > MAX_ITEM_BYTES:
            raise ItemTooLarge(number, MAX_ITEM_BYTES)
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise UndecodableUpload(number, error.reason) from None


def _decoded_chunks(stream: ByteStream) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    line = 1
    while True:
        chunk = stream.read(CHUNK_BYTES)
        try:
            text = decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError as error:
            raise UndecodableUpload(line + chunk[: error.start].count(b"\n"), error.reason) from None
        line += chunk.count(b"\n")
        if text:
            yield text
        if not chunk:
            return
