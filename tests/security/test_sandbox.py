"""The terminal tool's sandbox, attacked as a hostile model would: every attempt must fail, whatever it does.

Each test runs real commands in the real sandbox (bubblewrap) and checks the host afterwards."""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from rlctl.sandbox import errors as sandbox_errors
from rlctl.sandbox.bubblewrap import Sandbox, find_sandbox, require_sandbox
from rlctl.sandbox.toolbox import TOOL_NAMES, Toolbox
from rlctl.service.collections.service import require_terminal_sandbox
from rlctl.service.datasets.errors import SandboxUnavailable
from tests.support.reaper import processes_named
from tests.support.waiting import wait_until

SECRET = "sk-or-planted-secret-9f"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    target = tmp_path / "service-file.txt"
    target.write_text("not yours", encoding="utf-8")
    return target


@pytest.fixture
def toolbox(tmp_path: Path, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> Iterator[Toolbox]:
    monkeypatch.setenv("OPENROUTER_API_KEY", SECRET)
    work = tmp_path / "work"
    work.mkdir()
    with Toolbox(list(TOOL_NAMES), work, timeout_s=5.0, output_limit=4000, sandbox=sandbox) as toolbox:
        yield toolbox


def call(toolbox: Toolbox, name: str, **arguments: object) -> dict:
    return json.loads(toolbox.call(name, arguments))


def run(toolbox: Toolbox, command: str) -> dict:
    return call(toolbox, "terminal", command=command)


def test_the_command_sees_no_secret_file_or_process_of_the_service(toolbox: Toolbox, outside: Path) -> None:
    result = run(
        toolbox,
        "env; echo ---; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; echo ---; "
        f"cat {outside} 2>&1; ls {outside.parent} 2>&1; echo ---; ls /proc | grep -E '^[0-9]+$'",
    )
    assert result["exit_code"] == 0, result
    assert SECRET not in result["output"] and "not yours" not in result["output"]
    environment = result["output"].split("---")[0].split()
    assert {line.split("=")[0] for line in environment} <= {"PATH", "HOME", "LANG", "TERM", "PWD", "SHLVL", "_"}
    assert "No such file" in result["output"]  # the service's files are not in its view at all
    processes = [line for line in result["output"].split("---")[3].splitlines() if line.strip()]
    assert len(processes) <= 8, processes  # its own few (init, bash, ls, grep), none of the host's
    assert str(os.getpid()) not in processes


def test_only_the_work_directory_is_writable(toolbox: Toolbox) -> None:
    result = run(toolbox, "touch /usr/x /etc/x /x 2>&1; echo made > here.txt; pwd; id -u")
    assert result["output"].count("Read-only file system") + result["output"].count("Permission denied") >= 3
    assert not Path("/usr/x").exists() and not Path("/x").exists()
    assert (toolbox.workdir.root / "here.txt").read_text() == "made\n"
    assert result["output"].splitlines()[-2:] == ["/work", "1000"]


def test_no_network(toolbox: Toolbox) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        result = run(toolbox, f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED; exec 3<>/dev/tcp/1.1.1.1/80")
    finally:
        listener.close()
    assert "CONNECTED" not in result["output"] and result["exit_code"] != 0


def test_only_unix_and_ip_sockets_can_be_made(toolbox: Toolbox) -> None:
    """vsock reaches the hypervisor's host from a VM (where this runs, the host's kernel makes one), netlink the
    kernel's configuration, packet raw frames: the seccomp filter refuses every family but UNIX and IP."""
    probe = (
        "import socket\n"
        "for name, kind in (('AF_VSOCK', 'SOCK_STREAM'), ('AF_NETLINK', 'SOCK_RAW'), ('AF_PACKET', 'SOCK_RAW'),"
        " ('AF_BLUETOOTH', 'SOCK_STREAM'), ('AF_UNIX', 'SOCK_STREAM'), ('AF_INET', 'SOCK_STREAM'),"
        " ('AF_INET6', 'SOCK_DGRAM')):\n"
        "    try:\n"
        "        socket.socket(getattr(socket, name), getattr(socket, kind)).close(); print(name, 'made')\n"
        "    except OSError as error:\n"
        "        print(name, 'refused', error.errno)\n"
        "try:\n"
        "    socket.socketpair(socket.AF_VSOCK); print('pair made')\n"
        "except OSError as error:\n"
        "    print('pair refused', error.errno)\n"
    )
    assert call(toolbox, "write_file", path="probe.py", content=probe)["written_bytes"] == len(probe)
    result = run(toolbox, "/usr/bin/python3 -I probe.py")
    lines = dict(line.split(" ", 1) for line in result["output"].splitlines())
    for refused in ("AF_VSOCK", "AF_NETLINK", "AF_PACKET", "AF_BLUETOOTH", "pair"):
        assert lines[refused] == f"refused {errno.EAFNOSUPPORT}", result
    assert [lines[made] for made in ("AF_UNIX", "AF_INET", "AF_INET6")] == ["made"] * 3, result


def test_a_fork_bomb_stops_at_the_process_limit_and_the_host_keeps_running(toolbox: Toolbox) -> None:
    started = time.monotonic()
    result = run(toolbox, "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived")
    assert time.monotonic() - started < 60
    assert "Resource temporarily unavailable" in result["output"], result
    # The service still starts processes of its own, and the next call runs normally.
    assert run(toolbox, "echo fine")["output"] == "fine\n"


def test_every_process_ends_with_the_call_even_new_sessions(toolbox: Toolbox) -> None:
    marker = "rlctl-sandbox-escape-marker"
    result = run(toolbox, f"setsid sh -c 'exec -a {marker} sleep 600' </dev/null >/dev/null 2>&1 & disown; echo ok")
    assert result["exit_code"] == 0
    wait_until(lambda: not processes_named(marker), timeout=10, message="no sandboxed process outlives its call")
    stuck = run(toolbox, f"(exec -a {marker} sleep 600) & sleep 600")
    assert stuck["error"].startswith("timed out")
    wait_until(lambda: not processes_named(marker), timeout=10, message="no process outlives a timed-out call")


def test_links_made_in_the_sandbox_cannot_make_the_file_tools_escape(toolbox: Toolbox, outside: Path) -> None:
    # Inside the sandbox the host's files are not visible: a hard link to them cannot even be attempted.
    linked = run(toolbox, f"ln {outside} hard.txt 2>&1; ln -s {outside} soft.txt; ln -s / root; mkfifo pipe")
    assert "No such file" in linked["output"] or "cannot" in linked["output"]
    # Links made from the host (as a leaked path would let) are refused by the file tools: a file with a second name
    # (the item's tmpfs is a file system of its own, so the second name is made there, of one of its files).
    toolbox.workdir.write("mine.txt", b"mine")
    os.link(toolbox.workdir.root / "mine.txt", toolbox.workdir.root / "host-hard.txt")
    for path in ("soft.txt", "root/etc/passwd", "host-hard.txt", "pipe", "../service-file.txt", str(outside)):
        for result in (call(toolbox, "read_file", path=path), call(toolbox, "write_file", path=path, content="x")):
            assert "outside the working directory" in result.get("error", ""), (path, result)
    assert outside.read_text() == "not yours"
    assert call(toolbox, "write_file", path="a/b/c.txt", content="deep")["written_bytes"] == 4
    assert run(toolbox, "cat a/b/c.txt && echo more >> a/b/c.txt")["output"] == "deep"
    assert call(toolbox, "read_file", path="a/./b/../b/c.txt")["content"] == "deepmore\n"


def test_file_size_and_output_limits(toolbox: Toolbox) -> None:
    big = run(toolbox, "head -c 100000000 /dev/zero > big.bin; echo exit=$?; ls -l big.bin")
    assert "exit=153" in big["output"] or "File size limit" in big["output"]
    assert (toolbox.workdir.root / "big.bin").stat().st_size <= toolbox.sandbox.limits.file_bytes  # type: ignore[union-attr]
    flood = run(toolbox, "yes 0123456789 | head -c 5000000")
    assert flood["truncated"] and len(flood["output"]) == 4000


def test_an_items_disk_limits_hold_while_a_call_runs_whatever_its_paths(sandbox: Sandbox, tmp_path: Path) -> None:
    """Bytes and files are capped by the kernel as the command writes (the item's tmpfs): a command cannot hold
    more while it runs, nor hide bytes below a path longer than the OS allows."""
    small = replace(sandbox, limits=replace(sandbox.limits, disk_bytes=8 << 20, disk_inodes=300))
    root = tmp_path / "item"
    root.mkdir()
    with Toolbox(["terminal"], root, timeout_s=20.0, output_limit=4000, sandbox=small) as toolbox:
        if toolbox.item is None or toolbox.item.disk_mode != "tmpfs":
            pytest.skip(f"no item tmpfs here: {toolbox.item.disk_refusal if toolbox.item else 'no sandbox'}")
        assert str(root) not in Path("/proc/self/mountinfo").read_text()  # the host never sees the mount
        filled = run(toolbox, "head -c 12000000 /dev/zero > big.bin; echo exit=$?; ls -s --block-size=1 big.bin")
        assert "No space left on device" in filled["output"] and "exit=1" in filled["output"], filled
        assert toolbox.workdir.usage() <= 8 << 20 and "error" not in filled
        files = run(toolbox, "rm big.bin; i=0; while : > f$i 2>/dev/null; do i=$((i+1)); done; echo made=$i")
        assert 250 <= int(files["output"].split("made=")[1]) < 300, files
        deep = run(
            toolbox,
            "rm -f f*; n=$(printf 'd%.0s' $(seq 200)); for i in $(seq 120); do mkdir $n && cd $n || break; done; "
            "head -c 2000000 /dev/zero > bottom.bin; pwd | wc -c",
        )
        assert int(deep["output"].split()[-1]) > 4096, deep  # the path is longer than PATH_MAX
        assert toolbox.workdir.usage() >= 2_000_000  # and the bytes under it count
        keeper = toolbox.item.disk.process  # type: ignore[union-attr]
    assert keeper.returncode is not None and not root.exists()  # the tmpfs ended with the item


def test_without_a_sandbox_terminal_refuses_and_creation_is_refused(tmp_path: Path) -> None:
    assert isinstance(find_sandbox(str(tmp_path / "no-bwrap"), 65534), str)
    with pytest.raises(sandbox_errors.SandboxUnavailable, match="not installed"):
        require_sandbox(str(tmp_path / "no-bwrap"), 65534)
    with pytest.raises(SandboxUnavailable) as refused:
        require_terminal_sandbox(str(tmp_path / "no-bwrap"), 65534)
    assert refused.value.status_code == 409 and refused.value.code == "SANDBOX_UNAVAILABLE"
    assert refused.value.message.startswith("the terminal tool needs a sandbox and none can be made here: ")
    unsandboxed = Toolbox(list(TOOL_NAMES), tmp_path, timeout_s=1.0, output_limit=100, sandbox=None)
    result = json.loads(unsandboxed.call("terminal", {"command": "touch ran"}))
    assert "never runs unsandboxed" in result["error"] and not (tmp_path / "ran").exists()


def test_a_sandbox_that_cannot_have_a_network_is_refused_with_the_same_answer(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("rlctl.sandbox.bubblewrap.relay_python", lambda: None)
    with pytest.raises(sandbox_errors.NetworkUnavailable):
        require_sandbox(sandbox.bwrap, 65534, network=True)
    with pytest.raises(SandboxUnavailable) as refused:
        require_terminal_sandbox(sandbox.bwrap, 65534, network=True)
    assert refused.value.status_code == 409 and refused.value.code == "SANDBOX_UNAVAILABLE"
    assert refused.value.message == "the sandbox's network needs a Python interpreter under /usr and there is none"
    assert refused.value.details == {"tool": "terminal"}
