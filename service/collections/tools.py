"""Built-in tools of the batch runner, confined to one trajectory's work directory, with time and output limits.

`read_file` and `write_file` run in the service: they walk the path inside the work directory one name at a time
without following any link (`O_NOFOLLOW` at every step), and refuse `..` out of it, absolute paths, links, FIFOs
and files with more than one name (a hard link made by `terminal` is refused). `terminal` runs `bash -c` in the
sandbox of sandbox/bubblewrap.py (namespaces, seccomp, limits, no secrets, network only to the named
destinations), killed whole on time-out and when the command ends; only the first `output_limit` characters of its
output are kept, and going over the memory limit is the call's error. Without a sandbox it refuses.
"""

from __future__ import annotations

import json
import os
import posixpath
import stat
import subprocess
import threading
from pathlib import Path
from typing import Any

from sandbox.bubblewrap import LIMITS, Sandbox
from sandbox.errors import SandboxError
from sandbox.netgate import NetworkPolicy

TOOL_NAMES = ("terminal", "read_file", "write_file")
MAX_WRITE_BYTES = 1 << 20
# Opening a file never follows a link, and never blocks on a FIFO a command left there.
_NO_LINKS = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)

SCHEMAS: dict[str, dict[str, Any]] = {
    "terminal": {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a bash command in the working directory; output and running time are limited.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command line."}},
                "required": ["command"],
            },
        },
    },
    "read_file": {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file of the working directory.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "Path relative to the working directory."}},
                "required": ["path"],
            },
        },
    },
    "write_file": {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write (or replace) a text file of the working directory.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path relative to the working directory."},
                    "content": {"type": "string", "description": "The whole new content."},
                },
                "required": ["path", "content"],
            },
        },
    },
}


class ToolError(Exception):
    """A tool call that cannot be carried out; its message becomes the result's `error`."""


class Toolbox:
    def __init__(
        self,
        names: list[str],
        sandbox: Path,
        timeout_s: float,
        output_limit: int,
        runner: Sandbox | None = None,
        network: NetworkPolicy | None = None,
    ) -> None:
        self.names = [name for name in TOOL_NAMES if name in names]
        self.sandbox = sandbox.resolve()
        self.timeout_s = timeout_s
        self.output_limit = output_limit
        self.runner = runner  # None where no sandbox can be made: `terminal` then refuses to run
        self.network = network  # the destinations `terminal` may reach; None: no network at all
        self.disk_limit = runner.limits.disk_bytes if runner else LIMITS.disk_bytes
        self._owner = runner.drop_to_uid if runner else None
        if runner is not None:
            runner.prepare(self.sandbox)

    def schemas(self) -> list[dict[str, Any]]:
        return [SCHEMAS[name] for name in self.names]

    def call(self, name: str, arguments: Any) -> str:
        """The tool's result as JSON text; failures carry a non-null `error` (the stats' failure rule)."""
        try:
            if name not in self.names:
                raise ToolError(f"unknown tool {name!r}; available: {', '.join(self.names) or 'none'}")
            if not isinstance(arguments, dict):
                raise ToolError("arguments must be a JSON object")
            result = getattr(self, f"_{name}")(**_known(arguments, SCHEMAS[name]))
        except ToolError as error:
            result = {"error": str(error)}
        except TypeError as error:
            result = {"error": f"bad arguments: {error}"}
        return json.dumps(result, ensure_ascii=False)

    def _terminal(self, command: str) -> dict[str, Any]:
        if not isinstance(command, str) or not command.strip():
            raise ToolError("command must be a non-empty string")
        if "\x00" in command:
            raise ToolError("command must not contain NUL")
        if self.runner is None:
            raise ToolError("no sandbox can be made here: the terminal tool never runs unsandboxed")
        self._check_disk(0)
        try:
            started = self.runner.start(self.sandbox, command, self.network)
        except (SandboxError, OSError) as error:  # e.g. resumed where the relay's Python is gone
            raise ToolError(f"the sandbox could not be started: {error}") from None
        with started as call:
            output = _LimitedReader(call.process.stdout, self.output_limit)
            timed_out = False
            try:
                exit_code: int | None = call.process.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out, exit_code = True, None
            finally:
                call.close()  # bwrap dies, and with it (die-with-parent) the sandbox's whole PID namespace
                output.finish()
            memory_exceeded, refused = call.memory_exceeded, call.network_refused
        result: dict[str, Any] = {"exit_code": exit_code, "output": output.text(), "truncated": output.truncated}
        if refused:
            result["network_refused"] = refused  # destinations it tried that its collection does not name
        if timed_out:
            result["error"] = f"timed out after {self.timeout_s:g} s"
        if memory_exceeded:
            limit = self.runner.limits.memory_bytes
            result["error"] = f"the command went over its memory limit of {limit} bytes and was killed"
        used = disk_usage(self.sandbox)
        if used > self.disk_limit:
            result["error"] = f"the working directory holds {used} bytes, over its limit of {self.disk_limit}"
        return result

    def _read_file(self, path: str) -> dict[str, Any]:
        descriptor = self._open(path, os.O_RDONLY)
        with os.fdopen(descriptor, "rb") as handle:
            data = handle.read(self.output_limit * 4 + 1)
        text = data.decode("utf-8", errors="replace")
        truncated = len(text) > self.output_limit
        return {"content": text[: self.output_limit], "truncated": truncated}

    def _write_file(self, path: str, content: str) -> dict[str, Any]:
        if not isinstance(content, str):
            raise ToolError("content must be a string")
        data = content.encode("utf-8", errors="replace")
        if len(data) > MAX_WRITE_BYTES:
            raise ToolError(f"content over {MAX_WRITE_BYTES} bytes")
        self._check_disk(len(data))
        descriptor = self._open(path, os.O_WRONLY | os.O_CREAT)
        with os.fdopen(descriptor, "wb") as handle:
            handle.truncate(0)
            handle.write(data)
        return {"written_bytes": len(data), "path": self._relative(path)}

    def _check_disk(self, adding: int) -> None:
        used = disk_usage(self.sandbox)
        if used + adding > self.disk_limit:
            limit = self.disk_limit
            raise ToolError(f"the working directory would hold {used + adding} bytes, over its limit of {limit}")

    def _relative(self, path: Any) -> str:
        if not isinstance(path, str) or not path.strip() or "\x00" in path:
            raise ToolError("path must be a non-empty string")
        relative = posixpath.normpath(path)
        if path.startswith("/") or relative == ".." or relative.startswith("../") or relative == ".":
            raise ToolError(f"path {path!r} is outside the working directory")
        return relative

    def _open(self, path: str, flags: int) -> int:
        """A descriptor of a regular file inside the sandbox, reached without following any link, with a single
        name (a hard link made by `terminal` could name a file outside it). Missing directories are made when
        writing."""
        parts = self._relative(path).split("/")
        writing = bool(flags & os.O_CREAT)
        directory = os.open(self.sandbox, os.O_RDONLY | os.O_DIRECTORY)
        for part in parts[:-1]:
            directory = self._step(directory, part, path, create=writing)  # closes the one it steps from
        try:
            descriptor = os.open(parts[-1], flags | _NO_LINKS, 0o644, dir_fd=directory)
        except FileNotFoundError:
            raise ToolError(f"no file {path!r}") from None
        except IsADirectoryError:
            raise ToolError(f"{path!r} is a directory") from None
        except OSError as error:
            reason = f"it is a link or not a regular file ({error.strerror})"
            raise ToolError(f"path {path!r} is outside the working directory: {reason}") from None
        finally:
            os.close(directory)
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
            os.close(descriptor)
            raise ToolError(f"{path!r} is outside the working directory: not a regular file with a single name")
        if writing and self._owner is not None:
            os.fchown(descriptor, self._owner, self._owner)
        return descriptor

    def _step(self, directory: int, part: str, path: str, create: bool) -> int:
        """The descriptor of the subdirectory `part` (closing `directory`), never through a symbolic link."""
        try:
            try:
                following = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=directory)
            except FileNotFoundError:
                if not create:
                    raise ToolError(f"no file {path!r}") from None
                os.mkdir(part, 0o755, dir_fd=directory)
                following = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=directory)
                if self._owner is not None:
                    os.fchown(following, self._owner, self._owner)
            except (NotADirectoryError, OSError) as error:
                reason = f"{part!r} is a link or a file"
                raise ToolError(f"path {path!r} is outside the working directory: {reason}") from error
        finally:
            os.close(directory)
        return following


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


class _LimitedReader:
    """Drains a pipe on a thread, keeping the first `limit` characters' worth and discarding the rest."""

    def __init__(self, pipe: Any, limit: int) -> None:
        self._pipe = pipe
        self._limit_bytes = limit * 4
        self._limit = limit
        self._kept = bytearray()
        self.dropped = 0
        self._thread = threading.Thread(target=self._drain, name="tool-output", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while chunk := self._pipe.read1(65536):
            room = max(0, self._limit_bytes - len(self._kept))
            self._kept += chunk[:room]
            self.dropped += max(0, len(chunk) - room)

    def finish(self) -> None:
        self._thread.join(timeout=5)  # a daemon that escaped the group may hold the pipe: do not wait for it
        self._pipe.close()

    def text(self) -> str:
        return bytes(self._kept).decode("utf-8", errors="replace")[: self._limit]

    @property
    def truncated(self) -> bool:
        return self.dropped > 0 or len(bytes(self._kept).decode("utf-8", errors="replace")) > self._limit


def _known(arguments: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    allowed = schema["function"]["parameters"]["properties"]
    unknown = set(arguments) - set(allowed)
    if unknown:
        raise ToolError(f"unknown argument(s): {', '.join(sorted(unknown))}")
    return arguments
