"""Built-in tools of the batch runner, confined to one trajectory's sandbox directory, with time and output limits.

`read_file` and `write_file` resolve every path inside the sandbox and refuse anything that lands outside it
(`..`, absolute paths, symlinks). `terminal` runs `bash -c` in the sandbox, in its own process group (killed
whole on time-out and when the command ends), with a scrubbed environment (no secrets) and only the first
`output_limit` characters of its output kept. It is a working directory and limits, not an isolation boundary:
collect with models you trust, or run the service in a container.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

TOOL_NAMES = ("terminal", "read_file", "write_file")
MAX_WRITE_BYTES = 1 << 20

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
    def __init__(self, names: list[str], sandbox: Path, timeout_s: float, output_limit: int) -> None:
        self.names = [name for name in TOOL_NAMES if name in names]
        self.sandbox = sandbox.resolve()
        self.timeout_s = timeout_s
        self.output_limit = output_limit

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
        process = subprocess.Popen(
            ["/bin/bash", "-c", command],
            cwd=self.sandbox,
            env=_scrubbed_environment(self.sandbox),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        output = _LimitedReader(process.stdout, self.output_limit)
        timed_out = False
        try:
            exit_code: int | None = process.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out, exit_code = True, None
        finally:
            _kill_group(process.pid)  # whatever the command left running in the background goes too
            process.wait()
            output.finish()
        result: dict[str, Any] = {"exit_code": exit_code, "output": output.text(), "truncated": output.truncated}
        if timed_out:
            result["error"] = f"timed out after {self.timeout_s:g} s"
        return result

    def _read_file(self, path: str) -> dict[str, Any]:
        target = self._inside(path)
        if not target.is_file():
            raise ToolError(f"no file {path!r}")
        with target.open("rb") as handle:
            data = handle.read(self.output_limit * 4 + 1)
        text = data.decode("utf-8", errors="replace")
        truncated = len(text) > self.output_limit
        return {"content": text[: self.output_limit], "truncated": truncated}

    def _write_file(self, path: str, content: str) -> dict[str, Any]:
        if not isinstance(content, str):
            raise ToolError("content must be a string")
        data = content.encode("utf-8")
        if len(data) > MAX_WRITE_BYTES:
            raise ToolError(f"content over {MAX_WRITE_BYTES} bytes")
        target = self._inside(path)
        if target.is_dir():
            raise ToolError(f"{path!r} is a directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return {"written_bytes": len(data), "path": str(target.relative_to(self.sandbox))}

    def _inside(self, path: Any) -> Path:
        if not isinstance(path, str) or not path.strip() or "\x00" in path:
            raise ToolError("path must be a non-empty string")
        target = (self.sandbox / path).resolve()
        if target != self.sandbox and not target.is_relative_to(self.sandbox):
            raise ToolError(f"path {path!r} is outside the working directory")
        return target


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


def _scrubbed_environment(home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
    }


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
