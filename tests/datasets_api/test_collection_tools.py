"""The batch runner's file tools: confined to the work directory (the terminal's sandbox: tests/security)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.sandbox.toolbox import TOOL_NAMES, Toolbox


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
    (toolbox.workdir.root / "link").symlink_to(tmp_path / "outside.txt")
    for path in ("../outside.txt", str(tmp_path / "outside.txt"), "link", "/etc/passwd"):
        assert "outside the working directory" in call(toolbox, "read_file", path=path)["error"], path
    assert "outside" in call(toolbox, "write_file", path="../escape.txt", content="x")["error"]
    assert not (tmp_path / "escape.txt").exists()
    assert (tmp_path / "outside.txt").read_text() == "not yours"
    assert "no file" in call(toolbox, "read_file", path="missing.txt")["error"]


def test_bad_calls_are_results_with_an_error(toolbox: Toolbox) -> None:
    assert "unknown tool" in call(toolbox, "browser", url="x")["error"]
    assert "unknown argument" in call(toolbox, "terminal", command="ls", shell="zsh")["error"]
    assert "bad arguments" in call(toolbox, "write_file", path="a.txt")["error"]
    assert "arguments must be a JSON object" in json.loads(toolbox.call("terminal", "ls"))["error"]
    limited = Toolbox(["read_file"], toolbox.workdir.root, 1.0, 100)
    assert [s["function"]["name"] for s in limited.schemas()] == ["read_file"]
    assert "unknown tool" in json.loads(limited.call("terminal", {"command": "ls"}))["error"]
    assert "never runs unsandboxed" in call(toolbox, "terminal", command="ls")["error"]
