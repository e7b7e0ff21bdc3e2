"""A mixed run's `env` process (docs/RUNS.md#mixed-environments): one process per environment, all registering
with the run's trajectory API, each with its own config (and so its own weight).

    python -m rlctl.supervisor.mixture --member FILE CONFIG PREFIX [--member FILE CONFIG PREFIX ...]

Each member is a fork of this process that becomes `python FILE serve --config CONFIG` (the environment hook and
the libraries it imported are inherited, not imported again), with RLCTL_ENV_METRICS_PREFIX set to PREFIX so
that the hook copies its metrics under a name of its own. The members share this process's group, log and exit:
it ends once all have, with code 0 when all ended cleanly; when one fails (a non-zero code or a signal) the others
are stopped and this process ends as that one did, so the run's fate sharing (docs/RUNS.md#fate-sharing) sees the
environment fail as it would for one environment.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import signal
import sys
import time
import traceback

PREFIX_ENV = "RLCTL_ENV_METRICS_PREFIX"
STOP_GRACE_S = 10.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlctl.supervisor.mixture")
    parser.add_argument("--member", nargs=3, action="append", required=True, metavar=("FILE", "CONFIG", "PREFIX"))
    members = parser.parse_args(argv).member
    children: dict[int, str] = {}
    for file, config, prefix in members:
        children[_fork_member(file, config, prefix)] = prefix
    print(f"rlctl mixture: {len(children)} environments started: {', '.join(children.values())}", flush=True)
    while children:
        pid, status = os.wait()
        prefix = children.pop(pid, None)
        if prefix is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            print(f"rlctl mixture: environment {prefix} ended with {code}; stopping the others", flush=True)
            _stop(children)
            _end_as(code)
    return 0


def _fork_member(file: str, config: str, prefix: str) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.environ[PREFIX_ENV] = prefix
        sys.argv = [file, "serve", "--config", config]
        sys.path.insert(0, os.path.dirname(os.path.abspath(file)))  # as `python FILE` puts it first
        runpy.run_path(file, run_name="__main__")
        code = 0
    except SystemExit as request:
        code = request.code if isinstance(request.code, int) else (0 if request.code is None else 1)
    except BaseException:  # noqa: BLE001 - the member's failure is its exit code, with its traceback in the log
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code & 0xFF)


def _stop(children: dict[int, str]) -> None:
    """SIGTERM to the members still running, SIGKILL to those left after the grace period."""
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while children and time.monotonic() < deadline:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid:
            children.pop(pid, None)
        else:
            time.sleep(0.05)
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _end_as(code: int) -> None:
    """Exit as the failed member did: with its code, or killed by its signal."""
    if code < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1.0)  # the signal ends this process; a signal that does not is an exit code
    sys.stdout.flush()
    os._exit(code & 0xFF if code > 0 else 1)


if __name__ == "__main__":
    sys.exit(main())
