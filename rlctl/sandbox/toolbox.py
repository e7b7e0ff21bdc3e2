"""The tools an agent may call in a sandbox (`terminal`, `read_file`, `write_file`): their schemas, the checks of
their arguments and their results as JSON text, over the OS isolation of the `sandbox` package. One toolbox is one
trajectory's: a collection's (rlctl/service/collections/) or a tool environment's episode
(rlctl/environment_kit/tool_env.py, `SandboxTools`), the same tools with the same limits for both.

`read_file` and `write_file` run in the caller's process, confined to one trajectory's work directory
(rlctl/sandbox/workdir.py: no link followed, no path out of it, no file with two names). `terminal` runs `bash -c`
in the sandbox (rlctl/sandbox/bubblewrap.py: namespaces, seccomp, limits, no secrets, network only to the named
destinations), killed whole on time-out and when the command ends; only the first `output_limit` characters of its
output are kept, and going over the memory limit is the call's error. Without a sandbox it refuses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlctl.sandbox.bubblewrap import LIMITS, Sandbox
from rlctl.sandbox.commands import run_command
from rlctl.sandbox.errors import SandboxError, WorkDirRefusal
from rlctl.sandbox.netgate import NetworkPolicy
from rlctl.sandbox.quotas import ItemQuota
from rlctl.sandbox.workdir import WorkDir

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
    def __init__(
        self,
        names: list[str],
        workdir: Path,
        timeout_s: float,
        output_limit: int,
        sandbox: Sandbox | None = None,
        network: NetworkPolicy | None = None,
        quota: ItemQuota | None = None,
    ) -> None:
        self.names = [name for name in TOOL_NAMES if name in names]
        self.timeout_s = timeout_s
        self.output_limit = output_limit
        self.sandbox = sandbox  # None where no sandbox can be made: `terminal` then refuses to run
        self.network = network  # the destinations `terminal` may reach; None: no network at all
        # The item's kept sandbox: its work directory a tmpfs of its own where one can be made (ended by close)
        self.item = sandbox.item(workdir, quota) if sandbox else None
        self.workdir = self.item.workdir if self.item else WorkDir(workdir, LIMITS.disk_bytes)

    def close(self) -> None:
        """Ends the item's sandbox (its tmpfs and work directory go with it)."""
        if self.item is not None:
            self.item.close()

    def __enter__(self) -> Toolbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        except (ToolError, WorkDirRefusal) as error:
            result = {"error": str(error)}
        except TypeError as error:
            result = {"error": f"bad arguments: {error}"}
        return json.dumps(result, ensure_ascii=False)

    def _terminal(self, command: str) -> dict[str, Any]:
        if not isinstance(command, str) or not command.strip():
            raise ToolError("command must be a non-empty string")
        if "\x00" in command:
            raise ToolError("command must not contain NUL")
        if self.sandbox is None or self.item is None:
            raise ToolError("no sandbox can be made here: the terminal tool never runs unsandboxed")
        self.workdir.check_room(0)
        item = self.item
        try:
            ran = run_command(
                self.sandbox, item.root, command, self.timeout_s, self.output_limit, self.network, item.disk
            )
        except SandboxError as error:  # e.g. resumed where the relay's Python is gone
            raise ToolError(f"the sandbox could not be started: {error}") from None
        result: dict[str, Any] = {"exit_code": ran.exit_code, "output": ran.output, "truncated": ran.truncated}
        if ran.network_refused:
            result["network_refused"] = ran.network_refused  # destinations it tried that its collection does not name
        if ran.timed_out:
            result["error"] = f"timed out after {self.timeout_s:g} s"
        if ran.memory_exceeded:
            limit = self.sandbox.limits.memory_bytes
            result["error"] = f"the command went over its memory limit of {limit} bytes and was killed"
        used, disk_limit = self.workdir.usage(), self.workdir.disk_limit
        if used > disk_limit:
            result["error"] = f"the working directory holds {used} bytes, over its limit of {disk_limit}"
        return result

    def _read_file(self, path: str) -> dict[str, Any]:
        data = self.workdir.read(path, self.output_limit * 4 + 1)
        text = data.decode("utf-8", errors="replace")
        truncated = len(text) > self.output_limit
        return {"content": text[: self.output_limit], "truncated": truncated}

    def _write_file(self, path: str, content: str) -> dict[str, Any]:
        if not isinstance(content, str):
            raise ToolError("content must be a string")
        data = content.encode("utf-8", errors="replace")
        if len(data) > MAX_WRITE_BYTES:
            raise ToolError(f"content over {MAX_WRITE_BYTES} bytes")
        return {"written_bytes": len(data), "path": self.workdir.write(path, data)}


def _known(arguments: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    allowed = schema["function"]["parameters"]["properties"]
    unknown = set(arguments) - set(allowed)
    if unknown:
        raise ToolError(f"unknown argument(s): {', '.join(sorted(unknown))}")
    return arguments
