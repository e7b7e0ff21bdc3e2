"""One command line run in the sandbox to its end: within a time limit, keeping only the first characters of its
output, and saying what stopped it (the time limit, the memory limit) and which destinations it was refused."""

from __future__ import annotations

import io
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from rlctl.sandbox.bubblewrap import Sandbox
from rlctl.sandbox.errors import SandboxError
from rlctl.sandbox.itemdisk import ItemDisk
from rlctl.sandbox.netgate import NetworkPolicy


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None  # None when it was killed at its time limit
    output: str  # the first `output_limit` characters of stdout and stderr together
    truncated: bool
    timed_out: bool
    memory_exceeded: bool  # the kernel killed a process of it for going over the memory limit
    network_refused: list[str]  # destinations it tried that its policy does not name


def run_command(
    sandbox: Sandbox,
    workdir: Path,
    command: str,
    timeout_s: float,
    output_limit: int,
    network: NetworkPolicy | None = None,
    disk: ItemDisk | None = None,
) -> CommandResult:
    """Runs `bash -c command` in the sandbox (in the namespace of the item's tmpfs `disk`, where there is one);
    raises SandboxError when the sandbox cannot be started."""
    try:
        started = sandbox.start(workdir, command, network, disk)
    except OSError as error:  # e.g. a memory cgroup or the network gate's directory could not be made
        raise SandboxError(str(error)) from error
    with started as call:
        assert isinstance(call.process.stdout, io.BufferedReader)  # stdout=PIPE, buffered
        output = _OutputReader(call.process.stdout, output_limit)
        timed_out = False
        try:
            exit_code: int | None = call.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out, exit_code = True, None
        finally:
            call.close()  # bwrap dies, and with it (die-with-parent) the sandbox's whole PID namespace
            output.finish()
        return CommandResult(
            exit_code=exit_code,
            output=output.text(),
            truncated=output.truncated,
            timed_out=timed_out,
            memory_exceeded=call.memory_exceeded,
            network_refused=call.network_refused,
        )


class _OutputReader:
    """Drains a pipe on a thread, keeping the first `limit` characters' worth and discarding the rest."""

    def __init__(self, pipe: io.BufferedReader, limit: int) -> None:
        self._pipe = pipe
        self._limit_bytes = limit * 4
        self._limit = limit
        self._kept = bytearray()
        self._dropped = 0
        self._thread = threading.Thread(target=self._drain, name="tool-output", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while chunk := self._pipe.read1(65536):
            room = max(0, self._limit_bytes - len(self._kept))
            self._kept += chunk[:room]
            self._dropped += max(0, len(chunk) - room)

    def finish(self) -> None:
        self._thread.join(timeout=5)  # a daemon that escaped the group may hold the pipe: do not wait for it
        self._pipe.close()

    def text(self) -> str:
        return bytes(self._kept).decode("utf-8", errors="replace")[: self._limit]

    @property
    def truncated(self) -> bool:
        return self._dropped > 0 or len(bytes(self._kept).decode("utf-8", errors="replace")) > self._limit
