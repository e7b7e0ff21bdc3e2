"""The W&B mirror never holds or fails training (docs/TRAINER.md#outputs): a failing `log` is one run warning, a
`finish` stuck on an outage is left behind after its time-out. The run object here stands for a W&B run whose
uploads fail; the real library's network faults are exercised end to end in tests/runs/test_wandb_optional.py."""

from __future__ import annotations

import threading
import time

from rlctl.trainer.outputs import WandbMirror


class BrokenRun:
    name, id, url = "broken", "abc", "https://wandb.invalid/run"

    def __init__(self) -> None:
        self.release = threading.Event()

    def log(self, metrics: dict, step: int) -> None:
        raise ConnectionError("W&B went away")

    def finish(self, exit_code: int = 0) -> None:
        self.release.wait(60)  # an upload that never completes


def test_a_failing_log_is_one_warning_and_a_stuck_finish_is_left_behind() -> None:
    run = BrokenRun()
    mirror = WandbMirror(run)
    assert mirror.log_warning() is None
    mirror.log(1, {"reward/mean": 0.5})
    mirror.log(2, {"reward/mean": 0.6})
    warning = mirror.log_warning()
    assert warning is not None and warning["code"] == "wandb_log_failed"
    assert "step 1: ConnectionError" in warning["message"]  # the first failure, once
    started = time.monotonic()
    mirror.finish(timeout_s=0.5)
    assert time.monotonic() - started < 10
    run.release.set()


def test_an_offline_mirror_names_its_files_and_has_no_url(tmp_path) -> None:  # type: ignore[no-untyped-def]
    mirror = WandbMirror(BrokenRun(), "W&B could not start online (CommError: timed out)", tmp_path / "wandb")
    warning = mirror.warning()
    assert warning is not None and warning["code"] == "wandb_offline"
    assert f"wandb sync {tmp_path / 'wandb'}/offline-run-*" in warning["message"]
    assert mirror.run_url is None
