"""Dataset files under the data directory: records as JSON Lines plus an offsets index, staged then renamed.

```
datasets/{id}/records.jsonl       one stored record per line (rlctl/trajectories/records.py)
datasets/{id}/records.idx         8-byte little-endian byte offset of each line: record i is at idx[8 i]
datasets/{id}/meta.json           counts, stats and report, so the database row can be rebuilt from the files
datasets/{id}/compression.jsonl   per-record metrics of the operation that made it (+ .idx), when it has any
datasets/{id}/exports/{export_id}.jsonl   GRPO exports
datasets/.staging/{token}/        a dataset being written; renamed to datasets/{id}/ only when complete
```

Nothing partial is ever visible under `datasets/{id}/`: a dataset is written in a staging directory and renamed
whole. Memory stays bounded by one record whatever the dataset's size.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

OFFSET = struct.Struct("<Q")
STAGING = ".staging"
TRASH = ".trash"
UPLOADS = ".uploads"  # request bodies being received (routes.py)


@dataclass(frozen=True)
class DatasetFiles:
    directory: Path

    @property
    def records(self) -> Path:
        return self.directory / "records.jsonl"

    @property
    def index(self) -> Path:
        return self.directory / "records.idx"

    @property
    def meta(self) -> Path:
        return self.directory / "meta.json"

    @property
    def compression(self) -> Path:
        return self.directory / "compression.jsonl"

    @property
    def compression_index(self) -> Path:
        return self.directory / "compression.idx"

    @property
    def exports(self) -> Path:
        return self.directory / "exports"

    def export(self, export_id: str) -> Path:
        return self.exports / f"{export_id}.jsonl"


class DatasetStore:
    """Where datasets live; ids are validated by the caller (rlctl.service.names) before they reach a path."""

    def __init__(self, data_path: Path) -> None:
        self.root = data_path / "datasets"

    def files(self, dataset_id: str) -> DatasetFiles:
        return DatasetFiles(self.root / dataset_id)

    def staging(self, token: str) -> DatasetFiles:
        """A fresh staging directory (emptied if an interrupted attempt left one)."""
        directory = self.root / STAGING / token
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        return DatasetFiles(directory)

    def commit(self, staged: DatasetFiles, dataset_id: str) -> DatasetFiles:
        final = self.files(dataset_id)
        os.replace(staged.directory, final.directory)
        _fsync_directory(self.root)
        return final

    def discard(self, staged: DatasetFiles) -> None:
        shutil.rmtree(staged.directory, ignore_errors=True)

    def remove(self, dataset_id: str) -> None:
        """Moves the directory out of sight first, so a half-deleted dataset is never seen."""
        directory = self.files(dataset_id).directory
        if not directory.exists():
            return
        trash = self.root / TRASH / f"{dataset_id}-{os.getpid()}-{id(directory)}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        os.replace(directory, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def sweep(self, keep_staging: set[str], known_ids: set[str]) -> list[str]:
        """Removes what a crash left behind: staging and trash directories of no live job, and dataset
        directories no database row names. Returns what was removed."""
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        for special in (STAGING, TRASH, UPLOADS):
            for entry in (self.root / special).glob("*") if (self.root / special).is_dir() else []:
                if special != STAGING or entry.name not in keep_staging:
                    _remove(entry)
                    removed.append(str(entry))
        for entry in self.root.iterdir():
            if entry.is_dir() and entry.name not in (STAGING, TRASH, UPLOADS) and entry.name not in known_ids:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(str(entry))
        return removed


class IndexedJsonlWriter:
    """Appends JSON lines to a file and each line's byte offset to its index file."""

    def __init__(self, path: Path, index_path: Path) -> None:
        self._file: IO[bytes] = path.open("wb")
        self._index: IO[bytes] = index_path.open("wb")
        self.count = 0
        self.bytes = 0

    def write_line(self, line: str) -> None:
        data = line.encode("utf-8") + b"\n"
        self._index.write(OFFSET.pack(self.bytes))
        self._file.write(data)
        self.bytes += len(data)
        self.count += 1

    def write(self, value: Any) -> None:
        self.write_line(json.dumps(value, ensure_ascii=False, separators=(",", ":")))

    def close(self) -> None:
        for handle in (self._file, self._index):
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()

    def abort(self) -> None:
        self._file.close()
        self._index.close()

    def __enter__(self) -> IndexedJsonlWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def read_page(path: Path, index_path: Path, offset: int, limit: int) -> list[str]:
    """Lines offset … offset+limit−1, found through the index (no scan of the lines before them)."""
    if limit <= 0 or not path.exists():
        return []
    with index_path.open("rb") as index:
        index.seek(offset * OFFSET.size)
        entry = index.read(OFFSET.size)
    if len(entry) < OFFSET.size:
        return []
    (start,) = OFFSET.unpack(entry)
    lines = []
    with path.open("rb") as handle:
        handle.seek(start)
        for raw in handle:
            lines.append(raw.decode("utf-8").rstrip("\n"))
            if len(lines) >= limit:
                break
    return lines


def iter_lines(path: Path) -> Iterator[str]:
    with path.open("rb") as handle:
        for raw in handle:
            yield raw.decode("utf-8").rstrip("\n")


def write_json_atomically(path: Path, value: Any) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w", encoding="utf-8") as handle:
        json.dump(value, handle, ensure_ascii=False, default=str)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _fsync_directory(path: Path) -> None:
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
