"""File access confined to a work directory, without the tools above it: what it refuses is the wing's own
error (the collections' tools turn it into a tool error: tests/datasets_api/test_collection_tools.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlctl.sandbox.errors import SandboxError, WorkDirRefusal
from rlctl.sandbox.workdir import WorkDir, disk_usage, remove_tree


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


def deep_tree(root: Path, depth: int, name: str) -> None:
    """`depth` nested directories under `root`, made one step at a time (the whole path is far over PATH_MAX),
    with a 10,000-byte file at the bottom."""
    directory = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir(name, dir_fd=directory)
        below = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=directory)
        os.close(directory)
        directory = below
    file = os.open("bottom.bin", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=directory)
    os.write(file, b"x" * 10_000)
    os.close(file)
    os.close(directory)


def test_a_tree_deeper_than_the_stack_and_path_max_is_counted_and_removed_without_raising(tmp_path: Path) -> None:
    root = tmp_path / "work"
    root.mkdir()
    deep_tree(root, 1_500, "d" * 40)  # 61,500 characters of path: every path-based walk fails on it
    (root / "top.txt").write_bytes(b"y" * 5_000)
    assert disk_usage(root) >= 15_000  # the bottom file counts too
    with pytest.raises(WorkDirRefusal, match="over its limit"):
        WorkDir(root, disk_limit=12_000).check_room(0)
    os.chmod(root / ("d" * 40), 0o000)  # a command may close what it made to its owner: removal opens it again
    assert remove_tree(root) is True and not root.exists()
    assert remove_tree(root) is True  # already gone: nothing to do, nothing raised
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    assert remove_tree(link) is True and tmp_path.is_dir()  # a link is removed, never followed
