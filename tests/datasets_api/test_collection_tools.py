"""The batch runner's built-in tools: confined to the sandbox, time and output limited, no secrets inside."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from service.collections.tools import TOOL_NAMES, Toolbox
from tests.support.waiting import wait_until


@pytest.fixture
def toolbox(tmp_path: Path) -> Toolbox:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    (tmp_path / "outside.txt").write_text("not yours", encoding="utf-8")
    return Toolbox(list(TOOL_NAMES), sandbox, timeout_s=1.0, output_limit=1000)


def call(toolbox: Toolbox, name: str, **arguments: object) -> dict:
    return json.loads(toolbox.call(name, arguments))


def test_files_stay_inside_the_sandbox(toolbox: Toolbox, tmp_path: Path) -> None:
    assert call(toolbox, "write_file", path="notes/a.txt", content="hello")["written_bytes"] == 5
    assert call(toolbox, "read_file", path="notes/../notes/a.txt") == {"content": "hello", "truncated": False}
    (toolbox.sandbox / "link").symlink_to(tmp_path / "outside.txt")
    for path in ("../outside.txt", str(tmp_path / "outside.txt"), "link", "/etc/passwd"):
        assert "outside the working directory" in call(toolbox, "read_file", path=path)["error"], path
    assert "outside" in call(toolbox, "write_file", path="../escape.txt", content="x")["error"]
    assert not (tmp_path / "escape.txt").exists()
    assert (tmp_path / "outside.txt").read_text() == "not yours"
    assert "no file" in call(toolbox, "read_file", path="missing.txt")["error"]


def test_terminal_runs_in_the_sandbox_with_limits_and_no_secrets(
    toolbox: Toolbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-planted-secret")
    result = call(toolbox, "terminal", command="pwd; echo key=${OPENROUTER_API_KEY:-none}; exit 3")
    assert result["exit_code"] == 3 and "error" not in result
    assert result["output"].splitlines() == [str(toolbox.sandbox), "key=none"]

    flood = call(toolbox, "terminal", command="yes 0123456789 | head -c 5000000")
    assert flood["truncated"] and len(flood["output"]) == 1000

    started = time.monotonic()
    stuck = call(toolbox, "terminal", command="sleep 300 & echo $! > bg.pid; sleep 300")
    assert stuck["error"].startswith("timed out") and stuck["exit_code"] is None
    assert time.monotonic() - started < 30
    background = int((toolbox.sandbox / "bg.pid").read_text())
    wait_until(lambda: not _alive(background), timeout=10, message="background process killed with its group")


def test_bad_calls_are_results_with_an_error(toolbox: Toolbox) -> None:
    assert "unknown tool" in call(toolbox, "browser", url="x")["error"]
    assert "unknown argument" in call(toolbox, "terminal", command="ls", shell="zsh")["error"]
    assert "bad arguments" in call(toolbox, "write_file", path="a.txt")["error"]
    assert "arguments must be a JSON object" in json.loads(toolbox.call("terminal", "ls"))["error"]
    limited = Toolbox(["read_file"], toolbox.sandbox, 1.0, 100)
    assert [s["function"]["name"] for s in limited.schemas()] == ["read_file"]
    assert "unknown tool" in json.loads(limited.call("terminal", {"command": "ls"}))["error"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) counts as gone
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
