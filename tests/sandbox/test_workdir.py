"""File access confined to a work directory, without the tools above it: what it refuses is the wing's own
error (the collections' tools turn it into a tool error: tests/datasets_api/test_collection_tools.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.sandbox.errors import SandboxError, WorkDirRefusal
from rlctl.sandbox.workdir import WorkDir


def test_files_are_read_and_written_inside_and_refusals_are_the_wings_errors(tmp_path: Path) -> None:
    root = tmp_path / "work"
    root.mkdir()
    workdir = WorkDir(root, disk_limit=1 << 20)
    assert workdir.write("a/./b.txt", b"hello") == "a/b.txt"
    assert workdir.read("a/b.txt", 3) == b"hel"
    (root / "link").symlink_to(root / "a" / "b.txt")
    for path in ("../outside.txt", "/etc/passwd", "link", "a/b.txt/c", "", "missing.txt"):
        with pytest.raises(WorkDirRefusal):
            workdir.read(path, 10)
    with pytest.raises(WorkDirRefusal, match="over its limit of 1048576"):
        workdir.write("big.bin", b"x" * (2 << 20))
    assert not (root / "big.bin").exists() and issubclass(WorkDirRefusal, SandboxError)
