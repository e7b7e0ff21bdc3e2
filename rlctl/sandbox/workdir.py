"""File access confined to a call's work directory, for tools that run in the service rather than in the sandbox.

A path is walked from the work directory one name at a time without following any link (`O_NOFOLLOW` at every
step); `..` out of it, absolute paths, links, FIFOs (opened without blocking) and files with more than one name
(a hard link made by a sandboxed command could name a file outside) are refused. Writes are bounded by the
directory's disk limit, and made as the sandbox's user when the service is root.

Where the directory is an item's tmpfs (itemdisk.py), the kernel holds its limits and its use is read from the
file system; elsewhere the files are counted. Counting and removing walk the tree one directory descriptor at a
time, relative to it, without recursion: a tree deeper than the interpreter's stack, or whose paths are longer
than the OS allows, is counted and removed whole (`remove_tree` never raises: clean-up cannot fail an item).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat
from collections.abc import Callable
from pathlib import Path

from rlctl.sandbox.errors import WorkDirRefusal
from rlctl.sandbox.itemdisk import ItemDisk

# Opening a file never follows a link, and never blocks on a FIFO a command left there.
_NO_LINKS = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class WorkDir:
    def __init__(self, root: Path, disk_limit: int, owner_uid: int | None = None, disk: ItemDisk | None = None) -> None:
        self.disk = disk  # the item's tmpfs, seen through its keeper (never resolved: that would leave its view)
        self.root = disk.path if disk is not None else root.resolve()
        self.disk_limit = disk_limit  # bytes the whole directory may hold
        self.owner_uid = owner_uid  # who owns what is written (the sandbox's user); None: the service

    def read(self, path: str, max_bytes: int) -> bytes:
        """At most `max_bytes` of a regular file of the directory."""
        with os.fdopen(self._open(path, os.O_RDONLY), "rb") as handle:
            return handle.read(max_bytes)

    def write(self, path: str, data: bytes) -> str:
        """Writes (or replaces) a file, making missing directories; returns the path relative to the directory."""
        self.check_room(len(data))
        with os.fdopen(self._open(path, os.O_WRONLY | os.O_CREAT), "wb") as handle:
            handle.truncate(0)
            handle.write(data)
        return relative_path(path)

    def usage(self) -> int:
        if self.disk is not None:
            return self.disk.usage().used_bytes
        return disk_usage(self.root)

    def check_room(self, adding: int) -> None:
        used = self.usage()
        if used + adding > self.disk_limit:
            limit = self.disk_limit
            raise WorkDirRefusal(f"the working directory would hold {used + adding} bytes, over its limit of {limit}")

    def _open(self, path: str, flags: int) -> int:
        """A descriptor of a regular file with a single name, reached without following any link."""
        parts = relative_path(path).split("/")
        writing = bool(flags & os.O_CREAT)
        directory = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        for part in parts[:-1]:
            directory = self._step(directory, part, path, create=writing)  # closes the one it steps from
        try:
            descriptor = os.open(parts[-1], flags | _NO_LINKS, 0o644, dir_fd=directory)
        except FileNotFoundError:
            raise WorkDirRefusal(f"no file {path!r}") from None
        except IsADirectoryError:
            raise WorkDirRefusal(f"{path!r} is a directory") from None
        except OSError as error:
            reason = f"it is a link or not a regular file ({error.strerror})"
            raise WorkDirRefusal(f"path {path!r} is outside the working directory: {reason}") from None
        finally:
            os.close(directory)
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
            os.close(descriptor)
            raise WorkDirRefusal(f"{path!r} is outside the working directory: not a regular file with a single name")
        if writing and self.owner_uid is not None:
            os.fchown(descriptor, self.owner_uid, self.owner_uid)
        return descriptor

    def _step(self, directory: int, part: str, path: str, create: bool) -> int:
        """The descriptor of the subdirectory `part` (closing `directory`), never through a symbolic link."""
        try:
            try:
                following = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=directory)
            except FileNotFoundError:
                if not create:
                    raise WorkDirRefusal(f"no file {path!r}") from None
                os.mkdir(part, 0o755, dir_fd=directory)
                following = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=directory)
                if self.owner_uid is not None:
                    os.fchown(following, self.owner_uid, self.owner_uid)
            except OSError as error:
                reason = f"{part!r} is a link or a file"
                raise WorkDirRefusal(f"path {path!r} is outside the working directory: {reason}") from error
        finally:
            os.close(directory)
        return following


def relative_path(path: str) -> str:
    """`path` normalised, refused when empty or when it leaves the directory (absolute, or `..` out of it)."""
    if not isinstance(path, str) or not path.strip() or "\x00" in path:
        raise WorkDirRefusal("path must be a non-empty string")
    relative = posixpath.normpath(path)
    if path.startswith("/") or relative == ".." or relative.startswith("../") or relative == ".":
        raise WorkDirRefusal(f"path {path!r} is outside the working directory")
    return relative


def disk_usage(root: Path) -> int:
    """Bytes held by the files under `root`, links not followed, however deep."""
    total = 0

    def count(directory: int, entry: os.DirEntry[str]) -> None:
        nonlocal total
        total += entry.stat(follow_symlinks=False).st_blocks * 512

    _walk(root, count, None)
    return total


def remove_tree(root: Path) -> bool:
    """Removes `root` and everything under it, however deep or long its paths; never raises. Returns whether it
    is gone (what could not be removed, e.g. a file of another user, is left)."""

    def unlink(directory: int, entry: os.DirEntry[str]) -> None:
        os.unlink(entry.name, dir_fd=directory)

    def rmdir(directory: int, name: str) -> None:
        os.rmdir(name, dir_fd=directory)

    try:
        if root.is_symlink() or (root.exists() and not root.is_dir()):
            root.unlink()
            return True
        if not root.exists():
            return True
        _walk(root, unlink, rmdir)
        root.rmdir()
        return True
    except Exception:  # noqa: BLE001 - clean-up must never fail what it cleans up after
        return not root.exists() and not root.is_symlink()


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


def _walk(
    root: Path,
    visit: Callable[[int, os.DirEntry[str]], None],
    leave: Callable[[int, str], None] | None,
) -> None:
    """Depth-first over the tree under `root` with one directory descriptor open at a time: `visit(directory,
    entry)` for each entry that is not a directory, `leave(parent, name)` after a directory's contents. Each
    directory is opened relative to its parent with O_NOFOLLOW, and its parent reopened as `..` and checked to be
    the directory it came from (a tree moved meanwhile ends the walk instead of leading elsewhere). Errors on one
    entry skip it."""
    directory = os.open(root, _DIRECTORY)
    stack: list[tuple[str, tuple[int, int], list[str]]] = [("", _identity(directory), _scan(directory, visit))]
    try:
        while stack:
            _name, _identity_of, pending = stack[-1]
            if pending:
                name = pending.pop()
                child = _open_child(directory, name, fix_modes=leave is not None)
                if child is None:
                    continue
                os.close(directory)
                directory = child
                stack.append((name, _identity(directory), _scan(directory, visit)))
                continue
            name, _, _ = stack.pop()
            if not stack:
                return
            parent = os.open("..", _DIRECTORY, dir_fd=directory)
            os.close(directory)
            directory = parent
            if _identity(directory) != stack[-1][1]:
                return
            if leave is not None:
                with contextlib.suppress(OSError):
                    leave(directory, name)
    finally:
        os.close(directory)


def _identity(directory: int) -> tuple[int, int]:
    status = os.fstat(directory)
    return status.st_dev, status.st_ino


def _open_child(directory: int, name: str, fix_modes: bool) -> int | None:
    """The subdirectory `name`, never through a link; when removing, a directory closed to its owner is opened
    to it first (a command may chmod 000 what it made)."""
    for attempt in range(2):
        try:
            return os.open(name, _DIRECTORY | os.O_NOFOLLOW, dir_fd=directory)
        except PermissionError:
            if not fix_modes or attempt:
                return None
            with contextlib.suppress(OSError, NotImplementedError):
                os.chmod(name, 0o700, dir_fd=directory, follow_symlinks=False)
                continue
            with contextlib.suppress(OSError):
                os.chmod(name, 0o700, dir_fd=directory)
        except OSError:
            return None
    return None


def _scan(directory: int, visit: Callable[[int, os.DirEntry[str]], None]) -> list[str]:
    """Visits the directory's other entries; returns the names of its subdirectories."""
    subdirectories = []
    try:
        with os.scandir(directory) as entries:
            listed = list(entries)
    except OSError:
        return []
    for entry in listed:
        try:
            if entry.is_dir(follow_symlinks=False):
                subdirectories.append(entry.name)
            else:
                visit(directory, entry)
        except OSError:
            continue
    return subdirectories
