"""A mixed run's `env` process (rlctl/supervisor/mixture.py), with plain scripts as its members: each member runs
as `FILE serve --config CONFIG` with its metric prefix, and the mix ends as its first failing member did."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.waiting import scaled

REPO_ROOT = Path(__file__).resolve().parents[2]

RECORDS = """
import os, sys, pathlib
pathlib.Path(sys.argv[3] + ".seen").write_text(f"{sys.argv[1]} {os.environ['RLCTL_ENV_METRICS_PREFIX']} {os.getpid()}")
"""
WAITS = RECORDS + "import time\nwhile True: time.sleep(0.05)\n"
# A member that fails once its sibling `waits` has started (it then has a pid to look for).
AFTER_SIBLING = RECORDS + (
    "import time\nwhile not pathlib.Path(sys.argv[3]).with_name('waits.yaml.seen').exists(): time.sleep(0.02)\n"
)


def mix(tmp_path: Path, *members: tuple[str, str]) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "rlctl.supervisor.mixture"]
    for index, (name, source) in enumerate(members):
        script = tmp_path / f"{name}.py"
        script.write_text(source)
        argv += ["--member", str(script), str(tmp_path / f"{name}.yaml"), f"env/{index}.{name}/"]
    return subprocess.Popen(argv, cwd=REPO_ROOT, start_new_session=True)


def seen(tmp_path: Path, name: str) -> list[str]:
    return (tmp_path / f"{name}.yaml.seen").read_text().split()


def test_members_run_with_their_config_and_prefix_and_a_clean_mix_ends_0(tmp_path: Path) -> None:
    process = mix(tmp_path, ("first", RECORDS), ("second", RECORDS))
    assert process.wait(timeout=scaled(60)) == 0
    assert seen(tmp_path, "first")[:2] == ["serve", "env/0.first/"]
    assert seen(tmp_path, "second")[:2] == ["serve", "env/1.second/"]


def test_a_failing_member_stops_the_others_and_the_mix_ends_with_its_code(tmp_path: Path) -> None:
    process = mix(tmp_path, ("waits", WAITS), ("fails", AFTER_SIBLING + "sys.exit(3)\n"))
    try:
        assert process.wait(timeout=scaled(60)) == 3
        waiting_pid = int(seen(tmp_path, "waits")[2])
        assert not _alive(waiting_pid)
    finally:
        _kill_group(process)


def test_a_killed_member_kills_the_mix_with_its_signal(tmp_path: Path) -> None:
    suicide = AFTER_SIBLING + "import signal\nos.kill(os.getpid(), signal.SIGKILL)\n"
    process = mix(tmp_path, ("waits", WAITS), ("killed", suicide))
    try:
        assert process.wait(timeout=scaled(60)) == -signal.SIGKILL
        assert not _alive(int(seen(tmp_path, "waits")[2]))
    finally:
        _kill_group(process)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
