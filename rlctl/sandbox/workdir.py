"""File access confined to a call's work directory, for tools that run in the service rather than in the sandbox.

A path is walked from the work directory one name at a time without following any link (`O_NOFOLLOW` at every
step); `..` out of it, absolute paths, links, FIFOs (opened without blocking) and files with more than one name
(a hard link made by a sandboxed command could name a file outside) are refused. Writes are bounded by the
directory's disk limit, and made as the sandbox's user when the service is root.
"""

from __future__ import annotations

import os
import posixpath
import stat
from pathlib import Path

from rlctl.sandbox.errors import WorkDirRefusal

# Opening a file never follows a link, and never blocks on a FIFO a command left there.
_NO_LINKS = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class WorkDir:
    def __init__(self, root: Path, disk_limit: int, owner_uid: int | None = None) -> None:
        self.root = root.resolve()
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
    """Bytes held by the files under `root`, links not followed."""
    total = 0
    pending = [str(root)]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                else:
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
            except OSError:
                continue
    return total
