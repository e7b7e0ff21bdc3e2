"""The `rlctl` client commands, as real subprocesses against the real service over HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from rlctl.service.jobs.runner import JobFailed, JobHandle, JobKind, JobRunner
from rlctl.service.runs.paths import RunPaths
from rlctl.service.settings import Settings
from tests.conftest import build_settings
from tests.ops.cli import LineCollector, rlctl, spawn, stop
from tests.ops.seeding import SeededRun, seed_run
from tests.support.live import free_port, live_service
from tests.support.waiting import REQUEST_TIMEOUT, scaled, wait_until

TOKEN = "cli-client-token"
TERMINAL = {"completed", "stopped", "failed"}


@pytest.mark.e2e
def test_the_cli_drives_an_offline_run_to_completion_following_its_trainer_log(run_settings) -> None:  # type: ignore[no-untyped-def]
    settings = run_settings(api_token=TOKEN)
    with live_service(settings) as live, live.client() as api:
        started = rlctl(
            live.base_url,
            *("runs", "start", "echo", "--backend", "local", "--set", "group_size=8", "--set", "batch_size=32"),
            "--json",
            token=TOKEN,
        )
        assert started.returncode == 0, started.stderr
        run_id = json.loads(started.stdout)["id"]
        assert json.loads(started.stdout)["config"]["env"]["group_size"] == 8

        status_at_first_line: list[str] = []

        def first_line_seen(_line: str) -> None:
            if not status_at_first_line:
                status_at_first_line.append(api.get(f"/runs/{run_id}").json()["status"])

        log_follower = spawn(live.base_url, "runs", "logs", run_id, "trainer", "-f", "--tail", "100000", token=TOKEN)
        run_follower = spawn(live.base_url, "runs", "show", run_id, "-f", "--interval", "0.5", "--json", token=TOKEN)
        try:
            followed_log = LineCollector(log_follower.stdout, first_line_seen)
            progress, record = LineCollector(run_follower.stderr), LineCollector(run_follower.stdout)
            assert run_follower.wait(timeout=scaled(360)) == 0, progress.text()
            assert log_follower.wait(timeout=scaled(60)) == 0, log_follower.stderr.read()  # type: ignore[union-attr]
            for collector in (followed_log, progress, record):
                collector.join(timeout=10)
        finally:
            stop(log_follower)
            stop(run_follower)

        final = json.loads(record.text())
        assert final["id"] == run_id and final["status"] == "completed" and final["last_step"] == 6
        # live progress: a line per change, through the run's states and steps, ending at its last step
        lines = [line.strip() for _, line in progress.lines]
        assert any(": running  step " in line for line in lines)
        assert lines[-1].startswith(f"run {run_id} echo: completed  step 6/6  reward/mean ")
        # the trainer log was followed while the run went on, up to its last line
        assert status_at_first_line and status_at_first_line[0] not in TERMINAL
        log_file = RunPaths(settings.data_path, run_id).log("trainer").read_text()
        assert followed_log.text() and log_file.startswith(followed_log.text())
        assert "trainer completed at step 6/6" in followed_log.text()

        listed = rlctl(live.base_url, "runs", "list", token=TOKEN)
        assert listed.returncode == 0
        header, row = listed.stdout.splitlines()[:2]
        assert header.split()[:5] == ["ID", "ENVIRONMENT", "BACKEND", "STATUS", "STEP"]
        assert row.split()[:5] == [run_id, "echo", "local", "completed", "6/6"]

        results = rlctl(live.base_url, "runs", "results", run_id, "--json", token=TOKEN)
        assert json.loads(results.stdout)["final_metrics"] == api.get(f"/runs/{run_id}/results").json()["final_metrics"]
        table = rlctl(live.base_url, "runs", "results", run_id, token=TOKEN).stdout
        weights = api.get(f"/runs/{run_id}/results").json()["weights"]
        assert "reward/mean" in table and weights in table

        for _ in range(2):  # an ended run answers its final state every time, outside the limit
            checked = rlctl(live.base_url, "runs", "status", run_id, "--json", token=TOKEN)
            assert checked.returncode == 0 and json.loads(checked.stdout)["live"] is False
        live_id = seed_run(settings, SeededRun(status="running", process_status="running")).id
        checked = rlctl(live.base_url, "runs", "status", live_id, "--json", token=TOKEN)
        assert checked.returncode == 0 and json.loads(checked.stdout)["rate_limited"] is False
        limited = rlctl(live.base_url, "runs", "status", live_id, "--json", token=TOKEN)
        assert limited.returncode == 75 and json.loads(limited.stdout)["rate_limited"] is True
        assert "429 RATE_LIMITED" in limited.stderr

        again = rlctl(live.base_url, "runs", "stop", run_id, token=TOKEN)
        assert again.returncode == 1 and "409 INVALID_STATE" in again.stderr
        tail = rlctl(live.base_url, "runs", "logs", run_id, "trainer", "--tail", "2", token=TOKEN)
        assert tail.stdout.splitlines() == log_file.splitlines()[-2:]


def sqlite_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """The client does not care which database the service uses: these tests use one, not both."""
    return build_settings(tmp_path / "var", f"sqlite:///{tmp_path / 'rlctl.db'}", **overrides)


@pytest.mark.e2e
def test_environments_errors_and_connection_options(tmp_path: Path) -> None:
    with live_service(sqlite_settings(tmp_path, api_token=TOKEN)) as live:
        listed = rlctl(live.base_url, "envs", "list", token=TOKEN)
        assert listed.returncode == 0, listed.stderr
        names = [line.split()[0] for line in listed.stdout.splitlines()[1:]]
        assert {"echo", "gsm8k"} <= set(names) and listed.stdout.startswith("NAME")
        as_json = json.loads(rlctl(live.base_url, "envs", "list", "--json", token=TOKEN).stdout)
        assert sorted(e["name"] for e in as_json["environments"]) == sorted(names)

        shown = rlctl(live.base_url, "envs", "show", "echo", "--backend", "local", token=TOKEN)
        assert shown.returncode == 0
        configurable, locked = shown.stdout.split("Configurable fields")[1].split("Locked fields")
        assert "group_size" in configurable and "total_steps" in locked

        missing = rlctl(live.base_url, "runs", "show", "nope", token=TOKEN)
        assert missing.returncode == 1 and "404 RUN_NOT_FOUND" in missing.stderr and "request id" in missing.stderr
        missing_json = rlctl(live.base_url, "runs", "show", "nope", "--json", token=TOKEN)
        assert json.loads(missing_json.stdout)["error"]["code"] == "RUN_NOT_FOUND"
        unknown_field = rlctl(live.base_url, "runs", "start", "echo", "--set", "no_such_field=1", token=TOKEN)
        assert unknown_field.returncode == 1 and "UNKNOWN_FIELD" in unknown_field.stderr
        malformed = rlctl(live.base_url, "runs", "start", "echo", "--set", "group_size", token=TOKEN)
        assert malformed.returncode == 1 and "FIELD=VALUE" in malformed.stderr
        assert (
            httpx.get(
                f"{live.base_url}/runs", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=REQUEST_TIMEOUT
            ).json()["count"]
            == 0
        )

        wrong_token = rlctl(live.base_url, "runs", "list", token="not-the-token")
        assert wrong_token.returncode == 1 and "401 UNAUTHORIZED" in wrong_token.stderr
        assert TOKEN not in wrong_token.stderr + wrong_token.stdout

        # --url and --token win over the environment, before or after the command name
        dead = f"http://127.0.0.1:{free_port()}"
        unreachable = rlctl(dead, "runs", "list", token=TOKEN)
        assert unreachable.returncode == 3 and "cannot reach" in unreachable.stderr
        for args in (("--url", live.base_url, "runs", "list"), ("runs", "list", "--url", live.base_url)):
            assert rlctl(dead, *args, "--token", TOKEN).returncode == 0


gate = threading.Event()


def _stepping(_ctx: Any, handle: JobHandle) -> dict[str, Any]:
    handle.progress(1, 3, force=True)
    wait_until(lambda: gate.is_set() or handle.cancelled, timeout=120, message="the test's go-ahead")
    handle.progress(3, 3, force=True)
    return {"counted": 3}


def _failing(_ctx: Any, _handle: JobHandle) -> dict[str, Any]:
    raise JobFailed("the input was not what it should be")


def _register(app: FastAPI) -> None:
    JobRunner.of(app.state.context).register(JobKind("cli_stepping", _stepping))
    JobRunner.of(app.state.context).register(JobKind("cli_failing", _failing))


@pytest.mark.e2e
def test_following_a_job_shows_live_progress(make_settings: Callable[..., Settings]) -> None:
    gate.clear()
    with live_service(make_settings(), _register) as live:
        runner = JobRunner.of(live.app.state.context)
        job_id = runner.submit("cli_stepping", {})
        follower = spawn(live.base_url, "jobs", "show", job_id, "-f", "--interval", "0.1", "--json")
        try:
            progress, output = LineCollector(follower.stderr), LineCollector(follower.stdout)
            # the job waits at 1/3 until the follower has shown it: progress is live, not a summary at the end
            wait_until(lambda: "running [######" in progress.text() and "1/3" in progress.text(), timeout=60)
            gate.set()
            follower.wait(timeout=scaled(60))
            progress.join(timeout=10)
            output.join(timeout=10)
        finally:
            gate.set()
            stop(follower)
        assert follower.returncode == 0
        assert json.loads(output.text())["result"] == {"counted": 3}
        assert progress.lines[-1][1].startswith(f"job {job_id} cli_stepping: succeeded [####################] 3/3")

        failing = runner.submit("cli_failing", {})
        assert runner.wait(failing, 30) == "failed"
        followed = rlctl(live.base_url, "jobs", "show", failing, "-f")
        assert followed.returncode == 1 and "the input was not what it should be" in followed.stderr

        listed = rlctl(live.base_url, "jobs", "list").stdout.splitlines()
        assert [line.split()[:3] for line in listed[1:]] == [
            [failing, "cli_failing", "failed"],
            [job_id, "cli_stepping", "succeeded"],
        ]
        ended = rlctl(live.base_url, "jobs", "cancel", job_id)
        assert ended.returncode == 1 and "409 INVALID_STATE" in ended.stderr


def test_dataset_runs_and_evaluations_from_the_cli_send_the_same_request_models(tmp_path: Path) -> None:
    with live_service(sqlite_settings(tmp_path, api_token=TOKEN)) as live:
        unknown = rlctl(live.base_url, "runs", "start", "--dataset", "nope", "--held-out", "0.2", token=TOKEN)
        assert unknown.returncode == 1 and "404 DATASET_NOT_FOUND" in unknown.stderr
        online = rlctl(live.base_url, "runs", "start", "--dataset", "nope", "--mode", "online", token=TOKEN)
        assert online.returncode == 1 and "404 DATASET_NOT_FOUND" in online.stderr  # looked up before its rewards
        sft = ("--dataset", "nope", "--mode", "sft", "--top-n", "2")
        supervised = rlctl(live.base_url, "runs", "start", *sft, token=TOKEN)
        assert supervised.returncode == 1 and "404 DATASET_NOT_FOUND" in supervised.stderr  # the request was whole
        top_n_offline = rlctl(live.base_url, "runs", "start", "--dataset", "nope", "--top-n", "2", token=TOKEN)
        assert top_n_offline.returncode == 1 and "422 VALIDATION_ERROR" in top_n_offline.stderr  # sft only
        mixed = rlctl(live.base_url, "runs", "start", "--mix", "echo=2", "--mix", "nope", token=TOKEN)
        assert mixed.returncode == 1 and "404 ENVIRONMENT_NOT_FOUND" in mixed.stderr
        both = rlctl(live.base_url, "runs", "start", "echo", "--mix", "echo", token=TOKEN)
        assert both.returncode == 1 and "422 VALIDATION_ERROR" in both.stderr
        neither = rlctl(live.base_url, "runs", "start", token=TOKEN)
        assert neither.returncode == 1 and "422 VALIDATION_ERROR" in neither.stderr  # environment or dataset
        # Resources go in the run's request model: the service validates them (docs/RUNS.md#resources).
        zero_cpus = rlctl(live.base_url, "runs", "start", "echo", "--cpus", "0", token=TOKEN)
        assert zero_cpus.returncode == 1 and "422 VALIDATION_ERROR" in zero_cpus.stderr
        too_many = rlctl(live.base_url, "runs", "start", "echo", "--gpus", "64", "--priority", "3", token=TOKEN)
        assert too_many.returncode == 1 and "422 RESOURCES_EXCEED_CAPACITY" in too_many.stderr
        evaluation = rlctl(live.base_url, "eval", "nope", "--reward", "echo", "--samples", "2", token=TOKEN)
        assert evaluation.returncode == 1 and "404 RUN_NOT_FOUND" in evaluation.stderr
